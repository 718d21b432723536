"""A worker's queued work as the router's policy sees it, between two load reports."""

from __future__ import annotations

import asyncio
from collections.abc import Generator

from radixmesh.router.config import RouterConfig
from radixmesh.router.pool import LoadReport, WorkerPool


def test_requests_ended_since_the_load_report_are_not_queued() -> None:
    async def run() -> list[int]:
        pool = WorkerPool(RouterConfig(workers=("127.0.0.1:1",)))
        handle = pool.workers["worker-0"]
        # Polled while our request and two others (sent to the worker directly) ran.
        handle.load = LoadReport(num_running=3)
        handle.in_flight = 1
        seen = [handle.candidate(0).queued]
        handle.request_ended()  # the next turn of that chat must not count it
        seen.append(handle.candidate(0).queued)
        handle.in_flight += 1  # ... which is now in flight itself
        seen.append(handle.candidate(0).queued)
        handle.load = LoadReport(num_running=0)  # the next report; the others ended too
        handle.ended_since_poll = 0
        seen.append(handle.candidate(0).queued)
        return seen

    assert asyncio.run(run()) == [3, 2, 2, 1]


def test_a_request_ending_during_a_load_poll_stays_subtracted() -> None:
    from radixmesh.v1 import worker_pb2

    async def run() -> tuple[int, int]:
        pool = WorkerPool(RouterConfig(workers=("127.0.0.1:1",)))
        handle = pool.workers["worker-0"]
        handle.in_flight = 3
        handle.request_ended()  # before the poll: the report will not count it

        class Call:
            def __await__(self) -> Generator[None, None, worker_pb2.GetLoadResponse]:
                handle.request_ended()  # after the worker took its report of two running
                return worker_pb2.GetLoadResponse(num_running=2)
                yield

            async def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
                return ()

        class Stub:
            def GetLoad(self, request: object, **kwargs: object) -> Call:
                return Call()

        handle.stub = Stub()  # type: ignore[assignment]
        assert await handle.poll()
        return handle.candidate(0).queued, handle.ended_since_poll

    assert asyncio.run(run()) == (1, 1)


def test_pending_prefill_counts_requests_until_they_stream() -> None:
    async def run() -> list[tuple[int, int]]:
        pool = WorkerPool(RouterConfig(workers=("127.0.0.1:1",)))
        handle = pool.workers["worker-0"]
        seen = []
        handle.request_started(4000)  # a cold prompt
        handle.request_started(64)  # a cached one: only its uncached tail waits
        seen.append((handle.candidate(0).pending_prefill, handle.in_flight))
        handle.request_streaming(4000)  # the cold one's first chunk
        seen.append((handle.candidate(0).pending_prefill, handle.in_flight))
        handle.request_streaming(64)  # the other failed before streaming
        handle.request_ended()
        handle.request_ended()
        seen.append((handle.candidate(0).pending_prefill, handle.in_flight))
        return seen

    assert asyncio.run(run()) == [(4064, 2), (64, 2), (0, 0)]
