"""The SDK honours a server's retry-after: a retry waits at least what the server asked,
at most that plus the jitter and never past the cap; a longer ask is not waited for.

The waits are recorded by an injected sleep (no wall time passes)."""

from __future__ import annotations

import asyncio
import email.utils
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from radixmesh.client import AsyncClient, Client, InvalidArgument, Overloaded, Unavailable
from radixmesh.client.convert import parse_retry_after, server_retry_after
from radixmesh.client.options import ClientOptions, Deadline, retry_wait


class Refusal(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, *metadata: tuple[str, str]) -> None:
        self._code, self._md = code, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "refused"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md


UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def low(a: float, b: float) -> float:
    return a


def high(a: float, b: float) -> float:
    return b


def test_a_retry_waits_the_servers_retry_after_with_jitter_and_a_cap() -> None:
    opts = ClientOptions(max_retry_after=10.0, retry_after_jitter=0.25)
    e = Refusal(UNAVAILABLE, ("retry-after", "4"))
    assert retry_wait(e, 0, opts, low) == 4.0
    assert retry_wait(e, 0, opts, high) == 5.0
    assert retry_wait(e, 2, opts, high) == 5.0  # not the backoff's doubling
    near_cap = Refusal(UNAVAILABLE, ("retry-after", "9"))
    assert retry_wait(near_cap, 0, opts, high) == 10.0  # 11.25 capped, never below 9
    assert retry_wait(Refusal(UNAVAILABLE, ("retry-after", "11")), 0, opts) is None
    assert retry_wait(e, 3, opts) is None  # max_retries (3) spent
    for _ in range(200):  # the real generator stays in the bounds
        delay = retry_wait(e, 0, opts)
        assert delay is not None and 4.0 <= delay <= 5.0


def test_without_retry_after_the_backoff_applies() -> None:
    opts = ClientOptions(backoff=0.1, max_backoff=2.0)
    e = Refusal(UNAVAILABLE)
    assert [retry_wait(e, a, opts, high) for a in range(3)] == [0.1, 0.2, 0.4]
    assert retry_wait(e, 0, opts, low) == 0.0


def test_the_retry_after_keys_and_formats() -> None:
    ours = Refusal(UNAVAILABLE, ("radixmesh-retry-after", "2.5"))
    assert server_retry_after(ours) == 2.5
    assert server_retry_after(Refusal(UNAVAILABLE, ("retry-after", "7"))) == 7.0
    assert server_retry_after(Refusal(UNAVAILABLE, ("retry-after", "soon"))) is None
    assert server_retry_after(Refusal(UNAVAILABLE, ("other", "3"))) is None
    date = email.utils.formatdate(1_000_030.0, usegmt=True)  # an HTTP-date 30 s ahead
    assert parse_retry_after(date, now=1_000_000.0) == 30.0
    assert parse_retry_after(date, now=1_000_100.0) == 0.0  # past: at once
    assert parse_retry_after(b"120") == 120.0
    assert parse_retry_after("-3") == 0.0
    for bad in ("", "nan", "inf", "Tuesday"):
        assert parse_retry_after(bad) is None


def test_overload_is_retried_only_when_asked() -> None:
    full = Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, ("radixmesh-retry-after", "1"))
    too_big = Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED)  # a message over the size limit
    assert retry_wait(full, 0, ClientOptions(), high) is None
    opts = ClientOptions(retry_overloaded=True, retry_after_jitter=0.5)
    assert retry_wait(full, 0, opts, high) == 1.5
    assert retry_wait(too_big, 0, opts) is None


def test_bad_options_name_the_field() -> None:
    for field in ("max_retry_after", "retry_after_jitter", "backoff", "max_backoff"):
        with pytest.raises(InvalidArgument) as e:
            ClientOptions(**{field: -1.0})  # type: ignore[arg-type]
        assert e.value.field == field


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    # Only this test's thread is recorded (and does not wait): threads another test left
    # running in this process sleep as usual, and their sleeps are not the client's.
    waits: list[float] = []
    this_thread = threading.get_ident()
    real_sleep, real_async_sleep = time.sleep, asyncio.sleep

    def sleep(seconds: float) -> None:
        if threading.get_ident() != this_thread:
            return real_sleep(seconds)
        waits.append(seconds)
        return None

    monkeypatch.setattr("time.sleep", sleep)

    async def no_wait(seconds: float) -> None:
        if threading.get_ident() != this_thread:
            return await real_async_sleep(seconds)
        waits.append(seconds)
        return None

    monkeypatch.setattr("asyncio.sleep", no_wait)
    monkeypatch.setattr("random.uniform", low)
    yield waits


def failing(*errors: grpc.RpcError) -> Any:
    queue = list(errors)

    def fn(timeout: float | None) -> str:
        if queue:
            raise queue.pop(0)
        return "ok"

    return fn


def test_the_client_sleeps_the_retry_after(slept: list[float]) -> None:
    with Client("127.0.0.1:1", service="worker") as client:
        fn = failing(
            Refusal(UNAVAILABLE, ("radixmesh-retry-after", "1")),
            Refusal(UNAVAILABLE),  # no retry-after: the backoff (jitter low: 0)
            Refusal(UNAVAILABLE, ("retry-after", "3")),
        )
        assert client._retry(fn, Deadline(None)) == "ok"
        assert slept == [1.0, 0.0, 3.0]
        slept.clear()
        with pytest.raises(Unavailable) as e:  # 60 s is over the 30 s cap: raised at once
            client._retry(failing(Refusal(UNAVAILABLE, ("retry-after", "60"))), Deadline(None))
        assert slept == []
        with pytest.raises(Unavailable):  # a wait past the deadline is not begun
            client._retry(failing(Refusal(UNAVAILABLE, ("retry-after", "2"))), Deadline(1.0))
        assert slept == []
        full = Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, ("radixmesh-retry-after", "2"))
        with pytest.raises(Overloaded) as over:
            client._retry(failing(full), Deadline(None))
        assert (over.value.retry_after, slept) == (2.0, [])
    assert e.value.grpc_status == "UNAVAILABLE"


def test_the_async_client_sleeps_the_retry_after(slept: list[float]) -> None:
    async def run() -> str:
        client = AsyncClient("127.0.0.1:1", service="worker")
        try:
            fn = failing(Refusal(UNAVAILABLE, ("retry-after", "2")))

            async def call(timeout: float | None) -> str:
                return str(fn(timeout))

            return await client._retry(call, Deadline(None))
        finally:
            await client.close()

    assert asyncio.run(run()) == "ok"
    assert slept == [2.0]


def test_the_clients_take_the_retry_options() -> None:
    with Client("127.0.0.1:1", max_retry_after=5.0, retry_overloaded=True) as client:
        assert (client.options.max_retry_after, client.options.retry_overloaded) == (5.0, True)
    with pytest.raises(InvalidArgument) as e:
        Client("127.0.0.1:1", max_retry_after=-1.0)
    assert e.value.field == "max_retry_after"

    async def make() -> tuple[float, bool]:
        client = AsyncClient("127.0.0.1:1", max_retry_after=2.0, retry_overloaded=True)
        await client.close()
        return client.options.max_retry_after, client.options.retry_overloaded

    assert asyncio.run(make()) == (2.0, True)
