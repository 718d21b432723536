"""A worker's queued work as the router's policy sees it: between two load reports, and
with the requests other router replicas sent there (the worker's request events)."""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Sequence

from radixmesh.router.config import RouterConfig
from radixmesh.router.outputs import Sink
from radixmesh.router.pool import LoadReport, WorkerPool
from radixmesh.v1 import worker_pb2


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


def _event(
    seq: int, kind: worker_pb2.CacheEventKind, rid: str, hashes: Sequence[int] = ()
) -> worker_pb2.CacheEvent:
    return worker_pb2.CacheEvent(
        epoch=7, sequence=seq, kind=kind, block_hashes=hashes, request_id=rid
    )


def test_the_view_counts_requests_another_replica_sent() -> None:
    pending_kind = worker_pb2.CACHE_EVENT_KIND_PENDING
    started, ended = (
        worker_pb2.CACHE_EVENT_KIND_REQUEST_STARTED,
        worker_pb2.CACHE_EVENT_KIND_REQUEST_ENDED,
    )

    async def run() -> list[tuple[int, int]]:
        config = RouterConfig(workers=("127.0.0.1:1",), replicas=2, replica_index=1)
        pool = WorkerPool(config)
        handle = pool.workers["worker-0"]
        handle.block_size = 16
        handle.summary.reset(7, 0, [1, 2, 3])  # the worker caches blocks 1-3
        seen = []
        # This replica's own request: counted from its decision on (it has a sink here).
        handle.request_started(64)
        handle.outputs.sinks["mine"] = Sink(handle, None)
        handle.apply(_event(1, pending_kind, "mine", [1, 2, 3, 4]))
        seen.append((handle.candidate(0).queued, handle.candidate(0).pending_prefill))
        # Another replica's: 2 of its 6 blocks are not cached here (32 tokens) ...
        handle.apply(_event(2, pending_kind, "theirs-a", [1, 2, 3, 4, 5, 6]))
        # ... and a cold one: 4 blocks, 64 tokens (block 4 is tentative now: 3 missing).
        handle.apply(_event(3, pending_kind, "theirs-b", [9, 10, 11, 12]))
        seen.append((handle.candidate(0).queued, handle.candidate(0).pending_prefill))
        handle.apply(_event(4, started, "theirs-a"))  # prefilled: no longer pending
        seen.append((handle.candidate(0).queued, handle.candidate(0).pending_prefill))
        handle.apply(_event(5, ended, "theirs-a"))
        handle.apply(_event(6, ended, "mine"))  # ours: counted by in_flight until it ends
        seen.append((handle.candidate(0).queued, handle.candidate(0).pending_prefill))
        handle.forget_others()  # a resync: what it missed is unknown
        seen.append((handle.candidate(0).queued, handle.candidate(0).pending_prefill))
        return seen

    # 64 own + 0.25 x (32 + 64) of the others' = 88; then 64 + 0.25 x 64 = 80.
    assert asyncio.run(run()) == [(1, 64), (3, 88), (3, 80), (2, 80), (1, 64)]


def test_one_router_keeps_the_others_requests_but_does_not_weigh_them() -> None:
    async def run() -> tuple[int, int, int, int]:
        pool = WorkerPool(RouterConfig(workers=("127.0.0.1:1",)))  # (replicas: 1)
        handle = pool.workers["worker-0"]
        handle.block_size = 16
        handle.apply(_event(1, worker_pb2.CACHE_EVENT_KIND_PENDING, "theirs", [1, 2]))
        c = handle.candidate(0)
        return c.queued, c.pending_prefill, len(handle.others), handle.others_pending

    assert asyncio.run(run()) == (0, 0, 1, 32)
