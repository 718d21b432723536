"""The SDK spreads calls: over every router of a `host:port,host:port` target (gRPC's
round_robin over those READY) and over `connections` connections to each address.

Two real gRPC servers on loopback serve the Router service's GetModelInfo and Generate,
recording the peer of every call and answering with their own name as the worker id.
Rotation is exact once every connection is READY, so each test first makes calls until
every server (and connection) has answered one, then counts from zero.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

import grpc
import pytest

from radixmesh.client import AsyncClient, Client, InvalidArgument
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc

CALLS = 8
PARAMS = {"max_new_tokens": 1}


class CountingRouter(router_pb2_grpc.RouterServicer):
    """Answers every call at once and records which connection (peer) it came on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.peers: Counter[str] = Counter()
        self.lock = threading.Lock()

    def _count(self, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.peers[context.peer()] += 1

    def calls(self) -> int:
        with self.lock:
            return sum(self.peers.values())

    def reset(self) -> None:
        with self.lock:
            self.peers.clear()

    def GetModelInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._count(context)
        info = common_pb2.ModelInfo(model="canned", context_length=64, vocab_size=16)
        return router_pb2.RouterGetModelInfoResponse(info=info)

    def Generate(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self._count(context)
        chunk = common_pb2.GenerateChunk(token_ids=[7], completion_tokens=1)
        chunk.finish.reason = common_pb2.FINISH_REASON_LENGTH
        yield router_pb2.RouterGenerateResponse(chunk=chunk, worker_id=self.name)


class Server:
    def __init__(self, name: str) -> None:
        self.router = CountingRouter(name)
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        router_pb2_grpc.add_RouterServicer_to_server(self.router, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None).wait()


@contextmanager
def servers(*names: str) -> Iterator[list[Server]]:
    with ExitStack() as stack:
        started = [Server(name) for name in names]
        for s in started:
            stack.callback(s.stop)
        yield started


def _target(started: list[Server]) -> str:
    return ",".join(s.address for s in started)


def _warm(call: Any, started: list[Server], peers_each: int = 1) -> None:
    """Call until every server has seen `peers_each` distinct connections (each is READY
    in the client from then on), then forget the calls."""
    deadline = time.monotonic() + 20.0
    while any(len(s.router.peers) < peers_each for s in started):
        assert time.monotonic() < deadline, [dict(s.router.peers) for s in started]
        call()
    for s in started:
        s.router.reset()


# ---- Client -----------------------------------------------------------------------------


def test_calls_alternate_over_two_routers() -> None:
    with servers("a", "b") as started, Client(_target(started), service="router") as client:
        _warm(client.model_info, started)
        served = [client.generate("hi", PARAMS).worker_id for _ in range(CALLS)]
    assert Counter(served) == {"a": CALLS // 2, "b": CALLS // 2}
    assert all(served[i] != served[i + 1] for i in range(CALLS - 1))  # strict rotation
    assert [s.router.calls() for s in started] == [CALLS // 2, CALLS // 2]


def test_a_stopped_router_is_skipped() -> None:
    with servers("a", "b") as started, Client(_target(started), service="router") as client:
        _warm(client.model_info, started)
        started[1].stop()
        served = [client.generate("hi", PARAMS).worker_id for _ in range(CALLS)]
        streamed = [c.worker_id for c in client.generate("hi", PARAMS, stream=True)]
    assert served == ["a"] * CALLS and streamed == ["a"]


def test_a_router_down_from_the_start_is_skipped() -> None:
    with servers("a", "b") as started:
        started[1].stop()
        with Client(_target(started), service="router") as client:
            served = [client.generate("hi", PARAMS).worker_id for _ in range(CALLS)]
    assert served == ["a"] * CALLS


def test_connections_open_distinct_connections_to_one_address() -> None:
    with servers("a") as started, Client(started[0].address, connections=4) as client:
        assert client.model_info().model == "canned"  # after asking for the service
        started[0].router.reset()
        for _ in range(CALLS):
            client.generate("hi", PARAMS)
        peers = started[0].router.peers
    assert len(peers) == 4 and set(peers.values()) == {CALLS // 4}


def test_connections_apply_to_each_address_of_a_list() -> None:
    with (
        servers("a", "b") as started,
        Client(_target(started), service="router", connections=2) as client,
    ):
        _warm(client.model_info, started, peers_each=2)
        served = [client.generate("hi", PARAMS).worker_id for _ in range(CALLS)]
    assert Counter(served) == {"a": CALLS // 2, "b": CALLS // 2}
    for s in started:
        assert len(s.router.peers) == 2 and set(s.router.peers.values()) == {CALLS // 4}


@pytest.mark.parametrize("connections", [0, -1])
def test_connections_below_one_name_the_field(connections: int) -> None:
    with pytest.raises(InvalidArgument) as e:
        Client("127.0.0.1:1", connections=connections)
    assert (e.value.field, e.value.message) == ("connections", f"must be >= 1, got {connections}")


# ---- AsyncClient ------------------------------------------------------------------------


async def _async_warm(client: AsyncClient, started: list[Server], peers_each: int = 1) -> None:
    deadline = time.monotonic() + 20.0
    while any(len(s.router.peers) < peers_each for s in started):
        assert time.monotonic() < deadline, [dict(s.router.peers) for s in started]
        await client.model_info()
    for s in started:
        s.router.reset()


async def _served(client: AsyncClient, calls: int = CALLS) -> list[str]:
    return [(await client.generate("hi", PARAMS)).worker_id for _ in range(calls)]


def test_async_calls_alternate_over_two_routers() -> None:
    async def run(target: str, started: list[Server]) -> list[str]:
        async with AsyncClient(target, service="router") as client:
            await _async_warm(client, started)
            return await _served(client)

    with servers("a", "b") as started:
        served = asyncio.run(run(_target(started), started))
        assert [s.router.calls() for s in started] == [CALLS // 2, CALLS // 2]
    assert Counter(served) == {"a": CALLS // 2, "b": CALLS // 2}
    assert all(served[i] != served[i + 1] for i in range(CALLS - 1))


def test_async_a_stopped_router_is_skipped() -> None:
    async def run(target: str, started: list[Server]) -> list[str]:
        async with AsyncClient(target, service="router") as client:
            await _async_warm(client, started)
            started[1].stop()
            served = await _served(client)
            stream = await client.generate("hi", PARAMS, stream=True)
            return served + [c.worker_id async for c in stream]

    with servers("a", "b") as started:
        served = asyncio.run(run(_target(started), started))
    assert served == ["a"] * (CALLS + 1)


def test_async_connections_open_distinct_connections_to_one_address() -> None:
    async def run(target: str) -> None:
        async with AsyncClient(target, service="router", connections=4) as client:
            await _served(client)

    with servers("a") as started:
        asyncio.run(run(started[0].address))
        peers = started[0].router.peers
    assert len(peers) == 4 and set(peers.values()) == {CALLS // 4}


def test_async_connections_below_one_name_the_field() -> None:
    with pytest.raises(InvalidArgument) as e:
        AsyncClient("127.0.0.1:1", connections=0)
    assert e.value.field == "connections"
