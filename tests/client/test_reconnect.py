"""A call whose channel cannot connect (its server restarting on the same port) is retried
for a time, not a count, and the channel's reconnect backoff fits the SDK's retries.

The restart is driven by the client's own failures, not by a clock: the server comes
back only once the call has failed to connect more often than `max_retries` allows, so
a count-bounded retry loop has already given up by then, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from radixmesh.client import AsyncClient, Client, Unavailable
from radixmesh.client.convert import never_connected
from radixmesh.client.options import (
    CHANNEL_OPTIONS,
    ClientOptions,
    Deadline,
    Retries,
    channel_options,
)
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc

MAX_RETRIES = 3


class NamedRouter(router_pb2_grpc.RouterServicer):
    def __init__(self, name: str) -> None:
        self.name = name

    def GetModelInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        info = common_pb2.ModelInfo(model=self.name, context_length=64, vocab_size=16)
        return router_pb2.RouterGetModelInfoResponse(info=info)


class Port:
    """A loopback port served by one NamedRouter at a time (stopped and started again)."""

    def __init__(self) -> None:
        self.port = 0
        self.server: grpc.Server | None = None

    def start(self, name: str) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        router_pb2_grpc.add_RouterServicer_to_server(NamedRouter(name), server)
        port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        assert port and (self.port in (0, port)), f"could not listen on {self.port} again"
        self.port = port
        server.start()
        self.server = server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(None).wait()
            self.server = None


@pytest.fixture
def port() -> Iterator[Port]:
    p = Port()
    p.start("before")
    yield p
    p.stop()


class RestartAfter:
    """Records the failures a client retries after; starts the server again once the call
    has failed to connect more than MAX_RETRIES times."""

    def __init__(self, port: Port) -> None:
        self.port = port
        self.failures: list[grpc.RpcError] = []

    def seen(self, e: grpc.RpcError) -> None:
        self.failures.append(e)
        if self.refused() == MAX_RETRIES + 1:
            self.port.start("after")

    def refused(self) -> int:
        return sum(never_connected(e) for e in self.failures)


def test_a_call_outlasts_its_servers_restart(port: Port) -> None:
    restart = RestartAfter(port)
    client = Client(
        f"127.0.0.1:{port.port}",
        service="router",
        timeout=60,
        max_retries=MAX_RETRIES,
        connect_retry_window=60,
    )
    try:
        assert client.model_info().model == "before"
        port.stop()
        real_wait = client._wait_retry

        def wait(e: grpc.RpcError, retries: Retries, deadline: Deadline) -> bool:
            restart.seen(e)
            return real_wait(e, retries, deadline)

        client._wait_retry = wait  # type: ignore[method-assign]
        assert client.model_info().model == "after"
    finally:
        client.close()
    # More failures to connect than max_retries, every one retried: the real grpc-core
    # messages are the ones never_connected knows.
    assert restart.refused() > MAX_RETRIES


def test_an_async_call_outlasts_its_servers_restart(port: Port) -> None:
    restart = RestartAfter(port)

    async def run() -> tuple[str, str]:
        client = AsyncClient(
            f"127.0.0.1:{port.port}",
            service="router",
            timeout=60,
            max_retries=MAX_RETRIES,
            connect_retry_window=60,
        )
        try:
            before = (await client.model_info()).model
            port.stop()
            real_wait = client._wait_retry

            async def wait(e: grpc.RpcError, retries: Retries, deadline: Deadline) -> bool:
                restart.seen(e)
                return await real_wait(e, retries, deadline)

            client._wait_retry = wait  # type: ignore[method-assign]
            return before, (await client.model_info()).model
        finally:
            await client.close()

    assert asyncio.run(run()) == ("before", "after")
    assert restart.refused() > MAX_RETRIES


class FakeRpcError(grpc.RpcError):
    def __init__(self, details: str, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE):
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


REFUSED = FakeRpcError(
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
    "Connection reset by peer"
)
ALL_DOWN = FakeRpcError("connections to all backends failing; last error: UNAVAILABLE")
ANSWERED = FakeRpcError("the router is still starting")


def high(a: float, b: float) -> float:
    return b


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_failures_to_connect_are_retried_for_the_window_not_a_count() -> None:
    clock = Clock()
    opts = ClientOptions(max_retries=2, backoff=0.1, max_backoff=2.0, connect_retry_window=10.0)
    retries = Retries(opts, clock)
    waits = []
    while (delay := retries.wait(REFUSED, high)) is not None:
        waits.append(delay)
        clock.now += delay
    assert waits[:5] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])  # the backoff, capped
    assert max(waits) == 2.0 and len(waits) > opts.max_retries
    assert sum(waits) == pytest.approx(10.0)  # the last wait ends at the window
    # A server's answer still counts against max_retries, separately.
    assert [retries.wait(ANSWERED, high) for _ in range(3)] == [0.1, 0.2, None]


def test_the_window_starts_at_the_first_failure_to_connect_and_a_response_resets_it() -> None:
    clock = Clock()
    retries = Retries(ClientOptions(connect_retry_window=5.0), clock)
    assert retries.wait(ANSWERED, high) == 0.1
    clock.now += 60.0  # before any failure to connect: not counted
    assert retries.wait(ALL_DOWN, high) == 0.1
    clock.now += 5.0
    assert retries.wait(REFUSED, high) is None
    retries.reset()
    assert retries.wait(REFUSED, high) == 0.1


def test_no_retries_means_none_for_failures_to_connect_either() -> None:
    assert Retries(ClientOptions(max_retries=0)).wait(REFUSED) is None


def test_what_counts_as_a_failure_to_connect() -> None:
    assert never_connected(REFUSED) and never_connected(ALL_DOWN)
    assert not never_connected(ANSWERED)
    assert not never_connected(FakeRpcError(REFUSED.details(), grpc.StatusCode.UNKNOWN))


def test_the_deadline_bounds_retries_to_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.sleep", lambda s: pytest.fail("waited past the deadline"))
    calls = 0

    def fn(timeout: float | None) -> str:
        nonlocal calls
        calls += 1
        raise REFUSED

    client = Client("127.0.0.1:1", service="worker", connect_retry_window=60)
    with client, pytest.raises(Unavailable):
        client._retry(fn, Deadline(0.0))
    assert calls == 1


def test_the_channel_reconnects_as_often_as_the_sdk_retries() -> None:
    """grpc-core fails calls at once between connection attempts: its reconnect backoff
    starts at the SDK's first backoff and never exceeds the SDK's longest wait."""
    opts = dict(CHANNEL_OPTIONS)
    defaults = ClientOptions()
    assert opts["grpc.initial_reconnect_backoff_ms"] == round(defaults.backoff * 1000)
    assert opts["grpc.max_reconnect_backoff_ms"] == round(defaults.max_backoff * 1000)
    assert "grpc.min_reconnect_backoff_ms" not in opts  # grpc-core's connect timeout
    for target in ("127.0.0.1:1", "ipv4:127.0.0.1:1,127.0.0.2:2"):
        assert set(CHANNEL_OPTIONS) <= set(channel_options(target, 2))
