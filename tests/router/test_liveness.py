"""The router's liveness rule (router/liveness.py) over a real gRPC server on loopback.

The server is a worker stand-in whose answers the test sets: its GetLoad answers at once,
after a delay past the router's health timeout (a busy worker's slow answer), with a load
age (an engine that has not answered for that long), or not at all once the server is
stopped (a dead worker: connection refused). Its output stream sends an empty batch every
50 ms while it `talks` (a worker streaming tokens). A `WorkerHandle` polls it as the
router's pool does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from radixmesh.router.config import RouterConfig
from radixmesh.router.liveness import judge
from radixmesh.router.pool import WorkerHandle, WorkerPool
from radixmesh.v1 import worker_pb2, worker_pb2_grpc
from radixmesh.wire import load_age, load_age_metadata

OK = None
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize(
    ("failure", "silent_for", "verdict"),
    [
        (OK, 0.0, "up"),
        (OK, 10.0, "up"),  # the window itself still counts as heard
        (OK, 10.5, "down"),  # the server answers, its engine has been silent
        (DEADLINE, 9.9, "busy"),
        (DEADLINE, 10.5, "down"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 1.0, "busy"),  # gRPC's call queue is full
        (grpc.StatusCode.UNAVAILABLE, 0.0, "down"),  # refused: dead, however recent
        (grpc.StatusCode.UNAUTHENTICATED, 0.0, "down"),
    ],
)
def test_judge(failure: grpc.StatusCode | None, silent_for: float, verdict: str) -> None:
    assert judge(failure, silent_for, window=10.0) == verdict


def test_load_age_reads_only_sane_values() -> None:
    assert load_age(load_age_metadata(2.5)) == 2.5
    assert load_age(load_age_metadata(-1.0)) == 0.0
    assert load_age((("radixmesh-load-age", b"1.25"),)) == 1.25
    for bad in ("nan", "inf", "soon"):
        assert load_age((("radixmesh-load-age", bad),)) == 0.0
    assert load_age(None) == 0.0 and load_age((("other", "3"),)) == 0.0


class StandIn(worker_pb2_grpc.WorkerServicer):
    def __init__(self) -> None:
        self.delay = 0.0  # seconds GetLoad waits before answering
        self.age = 0.0  # the load age it reports
        self.talks = asyncio.Event()  # set: the output stream sends a batch every 50 ms

    async def GetLoad(
        self, request: worker_pb2.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetLoadResponse:
        await asyncio.sleep(self.delay)
        context.set_trailing_metadata(load_age_metadata(self.age))
        return worker_pb2.GetLoadResponse(num_running=1)

    async def StreamOutputs(
        self, request: worker_pb2.StreamOutputsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.StreamOutputsResponse]:
        await context.send_initial_metadata(())
        while True:
            await self.talks.wait()
            yield worker_pb2.StreamOutputsResponse()
            await asyncio.sleep(0.05)

    async def StreamCacheEvents(
        self, request: worker_pb2.StreamCacheEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.StreamCacheEventsResponse]:
        await asyncio.Event().wait()  # no events
        yield worker_pb2.StreamCacheEventsResponse()

    async def GetCacheSnapshot(
        self, request: worker_pb2.GetCacheSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetCacheSnapshotResponse:
        return worker_pb2.GetCacheSnapshotResponse(epoch=1, block_size=16)


Scenario = Callable[[StandIn, WorkerHandle, grpc.aio.Server], Awaitable[None]]


def run(scenario: Scenario, window: float) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        stand_in = StandIn()
        worker_pb2_grpc.add_WorkerServicer_to_server(stand_in, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        config = RouterConfig(
            workers=(f"127.0.0.1:{port}",),
            health_interval=0.05,
            health_timeout=0.2,
            liveness_window=window,
        )
        pool = WorkerPool(config)
        handle = pool.workers["worker-0"]
        pool.start()
        try:
            await until(lambda: handle.healthy)
            await scenario(stand_in, handle, server)
        finally:
            await pool.close()
            await server.stop(grace=None)

    asyncio.run(asyncio.wait_for(main(), 20))


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> float:
    """Wait for `predicate`; returns time.monotonic() when it held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)
    return time.monotonic()


def test_a_slow_worker_that_streams_is_busy_and_down_once_silent_for_the_window() -> None:
    async def scenario(stand_in: StandIn, handle: WorkerHandle, server: grpc.aio.Server) -> None:
        stand_in.talks.set()
        stand_in.delay = 1.0  # every poll now passes the 0.2 s health timeout
        await until(lambda: handle.slow_polls >= 4)
        # Four timed-out polls (before: the first marked it down): busy, still routable.
        assert handle.reachable and handle.healthy
        assert handle.breaker.state == "closed" and handle.breaker.consecutive_failures == 0
        stand_in.talks.clear()
        await asyncio.sleep(0.1)  # a batch already on its way lands
        quiet_since = handle.last_heard
        down_at = await until(lambda: not handle.reachable)
        assert down_at - quiet_since >= 1.0  # not before the window of silence
        assert down_at - quiet_since < 1.0 + 2.0  # a poll or two later (a loaded machine)
        assert handle.breaker.consecutive_failures >= 1

    run(scenario, window=1.0)


def test_a_dead_worker_is_down_at_once_however_recently_it_spoke() -> None:
    async def scenario(stand_in: StandIn, handle: WorkerHandle, server: grpc.aio.Server) -> None:
        stand_in.talks.set()
        await until(lambda: time.monotonic() - handle.last_heard < 0.1)
        stopped_at = time.monotonic()
        await server.stop(grace=None)  # connections refused from now on
        down_at = await until(lambda: not handle.reachable)
        assert down_at - stopped_at < 5.0  # a window of 60 s did not hold it up
        assert handle.slow_polls == 0

    run(scenario, window=60.0)


def test_a_worker_whose_engine_is_silent_is_down_though_its_server_answers() -> None:
    async def scenario(stand_in: StandIn, handle: WorkerHandle, server: grpc.aio.Server) -> None:
        stand_in.age = 0.5  # a busy engine, read half a second ago: up
        await asyncio.sleep(0.3)
        assert handle.reachable and handle.breaker.consecutive_failures == 0
        # A hung engine: the server answers from its last read, 30 s old. Its last word
        # stays what the answers before said: down once that is 2 s (the window) old.
        stand_in.age = 30.0
        hung_at = time.monotonic()
        down_at = await until(lambda: not handle.reachable)
        assert 2.0 - 0.5 <= down_at - hung_at < 2.0 + 2.0
        assert handle.load.num_running == 1  # the answer came; its engine did not
        stand_in.age = 0.0
        await until(lambda: handle.reachable)  # answers again: up

    run(scenario, window=2.0)
