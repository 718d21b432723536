"""Retries: UNAVAILABLE is retried with jittered backoff, and only before the first token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from radixmesh.client import Client, InvalidArgument, Unavailable
from radixmesh.client.options import ClientOptions, Deadline
from radixmesh.v1 import common_pb2, worker_pb2


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "", field: str | None = None):
        self._code, self._details = code, details
        self._md = (("radixmesh-field", field),) if field else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    monkeypatch.setattr("time.sleep", lambda s: None)
    with Client("127.0.0.1:1", service="worker", max_retries=3) as c:
        yield c


def _chunk(ids: list[int], finish: bool = False) -> worker_pb2.GenerateResponse:
    c = common_pb2.GenerateChunk(token_ids=ids, completion_tokens=len(ids))
    if finish:
        c.finish.reason = common_pb2.FINISH_REASON_LENGTH
    return worker_pb2.GenerateResponse(chunk=c)


class FakeCall:
    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.cancelled = False

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            if isinstance(item, Exception):
                raise item
            yield item

    def cancel(self) -> None:
        self.cancelled = True


def test_unavailable_is_retried_until_success(client: Client) -> None:
    attempts: list[float | None] = []

    def fn(timeout: float | None) -> str:
        attempts.append(timeout)
        if len(attempts) < 3:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")
        return "ok"

    assert client._retry(fn, Deadline(None)) == "ok"
    assert attempts == [None, None, None]


def test_retries_stop_at_max_retries(client: Client) -> None:
    calls = 0

    def fn(timeout: float | None) -> str:
        nonlocal calls
        calls += 1
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down")

    with pytest.raises(Unavailable) as e:
        client._retry(fn, Deadline(None))
    assert calls == 4  # the first try + max_retries
    assert (str(e.value), e.value.grpc_status) == ("down", "UNAVAILABLE")


def test_other_statuses_are_not_retried(client: Client) -> None:
    calls = 0

    def fn(timeout: float | None) -> str:
        nonlocal calls
        calls += 1
        raise FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "top_k: must be >= 1", "top_k")

    with pytest.raises(InvalidArgument) as e:
        client._retry(fn, Deadline(None))
    assert calls == 1
    assert (e.value.field, e.value.message) == ("top_k", "must be >= 1")


def test_stream_retries_before_the_first_token(client: Client, monkeypatch: Any) -> None:
    calls = [
        FakeCall([FakeRpcError(grpc.StatusCode.UNAVAILABLE)]),
        FakeCall([_chunk([]), FakeRpcError(grpc.StatusCode.UNAVAILABLE)]),  # no token yet
        FakeCall([_chunk([5]), _chunk([6], finish=True)]),
    ]
    monkeypatch.setattr(client, "_generate_call", lambda *a: calls.pop(0))
    chunks = list(client.generate("hi", {"max_new_tokens": 2}, stream=True))
    assert [c.token_ids for c in chunks] == [[], [5], [6]]
    assert chunks[-1].finish_reason == "length"
    assert calls == []


def test_a_call_dropped_by_a_server_shutting_down_is_retried(
    client: Client, monkeypatch: Any
) -> None:
    calls = [
        FakeCall([FakeRpcError(grpc.StatusCode.CANCELLED, "CANCELLED")]),  # grpc-core's zombie
        FakeCall([_chunk([5], finish=True)]),
    ]
    monkeypatch.setattr(client, "_generate_call", lambda *a: calls.pop(0))
    chunks = list(client.generate("hi", {"max_new_tokens": 1}, stream=True))
    assert [c.token_ids for c in chunks] == [[5]] and calls == []


def test_stream_does_not_retry_after_a_token(client: Client, monkeypatch: Any) -> None:
    first = FakeCall([_chunk([5]), FakeRpcError(grpc.StatusCode.UNAVAILABLE, "worker died")])
    calls = [first, FakeCall([_chunk([9], finish=True)])]
    monkeypatch.setattr(client, "_generate_call", lambda *a: calls.pop(0))
    got: list[list[int]] = []
    with pytest.raises(Unavailable):
        for c in client.generate("hi", {"max_new_tokens": 2}, stream=True):
            got.append(c.token_ids)
    assert got == [[5]]
    assert len(calls) == 1 and first.cancelled


def test_backoff_is_jittered_and_capped() -> None:
    opts = ClientOptions(backoff=0.1, max_backoff=0.3)
    delays = [opts.retry_delay(attempt) for attempt in range(6) for _ in range(50)]
    assert all(0.0 <= d <= 0.3 for d in delays)
    assert len(set(delays)) > 250  # random, not a fixed schedule
    assert max(opts.retry_delay(0) for _ in range(200)) <= 0.1


def test_deadline_stops_retrying(client: Client) -> None:
    calls = 0

    def fn(timeout: float | None) -> str:
        nonlocal calls
        calls += 1
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)

    with pytest.raises(Unavailable):
        client._retry(fn, Deadline(0.0))
    assert calls == 1


class FakeRouterStub:
    """GetModelInfo answers with the given errors first, then as a router (or as a worker
    that lacks the method)."""

    def __init__(self, errors: list[grpc.StatusCode]) -> None:
        self.errors = errors
        self.calls = 0

    def GetModelInfo(self, req: object, timeout: float | None, metadata: object) -> object:
        self.calls += 1
        if self.errors:
            code = self.errors.pop(0)
            raise FakeRpcError(code, "the router is still starting")
        return object()


def test_resolving_a_router_still_starting_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new client's first call asks what its target is: a router that answers "still
    starting" (UNAVAILABLE) is asked again, as a call would be, not given up on."""
    monkeypatch.setattr("time.sleep", lambda s: None)
    with Client("127.0.0.1:1", max_retries=3) as c:
        stub = FakeRouterStub([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE])
        monkeypatch.setattr(type(c), "_router", property(lambda self: stub))
        assert c._resolve() == "router"
        assert stub.calls == 3
    with Client("127.0.0.1:1", max_retries=3) as c:
        stub = FakeRouterStub([grpc.StatusCode.UNIMPLEMENTED])
        monkeypatch.setattr(type(c), "_router", property(lambda self: stub))
        assert c._resolve() == "worker" and stub.calls == 1
    with Client("127.0.0.1:1", max_retries=2) as c:
        stub = FakeRouterStub([grpc.StatusCode.UNAVAILABLE] * 5)
        monkeypatch.setattr(type(c), "_router", property(lambda self: stub))
        with pytest.raises(Unavailable, match="still starting"):
            c._resolve()
        assert stub.calls == 3  # the first ask and max_retries more
