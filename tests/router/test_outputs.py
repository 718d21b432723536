"""The router's sinks: chunks taken together, failures after the chunks, stalls judged by
the worker's last word, shutdown failing every sink."""

from __future__ import annotations

import asyncio
import time

import pytest

from radixmesh.errors import Unavailable
from radixmesh.router.outputs import Sink, SinkWatch, WorkerStalled, pump_call
from radixmesh.v1 import common_pb2


class Worker:
    def __init__(self) -> None:
        self.worker_id = "w0"
        self.last_heard = time.monotonic()


def chunk(*tokens: int) -> common_pb2.GenerateChunk:
    return common_pb2.GenerateChunk(token_ids=tokens)


def test_get_takes_every_chunk_then_the_failure() -> None:
    async def run() -> None:
        sink = Sink(Worker(), None)
        sink.put(chunk(1))
        sink.put(chunk(2, 3))
        sink.fail(Unavailable("gone"))
        sink.fail(Unavailable("second"))  # the first failure stays
        got = await sink.get()
        assert [list(c.token_ids) for c in got] == [[1], [2, 3]]
        with pytest.raises(Unavailable, match="gone"):
            await sink.get()

    asyncio.run(run())


def test_get_waits_for_a_chunk() -> None:
    async def run() -> None:
        sink = Sink(Worker(), None)
        waiting = asyncio.ensure_future(sink.get())
        await asyncio.sleep(0)
        assert not waiting.done()
        sink.put(chunk(4))
        assert [list(c.token_ids) for c in await waiting] == [[4]]

    asyncio.run(run())


def test_a_silent_worker_stalls_its_sinks_one_that_answers_does_not() -> None:
    async def run() -> None:
        watch = SinkWatch(stall_timeout=30.0)
        silent, heard = Worker(), Worker()
        a, b = Sink(silent, None), Sink(heard, None)
        watch.add(a)
        watch.add(b)
        now = time.monotonic()
        watch.sweep(now + 29)
        assert a.error is None and b.error is None
        heard.last_heard = now + 20  # a health answer: busy, not hung
        watch.sweep(now + 31)
        assert (
            isinstance(a.error, WorkerStalled)
            and str(a.error) == "the worker sent nothing for 30 s"
        )
        assert b.error is None
        b.put(chunk(1))  # a chunk counts as a word from the worker too
        watch.sweep(b.touched + 29)
        assert b.error is None
        watch.discard(a)
        watch.discard(b)

    asyncio.run(run())


def test_stop_fails_every_sink_and_refuses_new_ones() -> None:
    async def run() -> None:
        watch = SinkWatch(stall_timeout=30.0)
        sinks = [Sink(Worker(), None) for _ in range(3)]
        for s in sinks:
            watch.add(s)
        watch.stop("shutting down")
        for s in sinks:
            with pytest.raises(Unavailable, match="shutting down"):
                await s.get()
        with pytest.raises(Unavailable, match="shutting down"):
            watch.add(Sink(Worker(), None))
        for s in sinks:
            watch.discard(s)

    asyncio.run(run())


def test_a_call_that_ended_without_its_finish_fails_once_the_finish_is_overdue() -> None:
    """A worker call that ends well must have sent the request's finish (on the call or
    on the output stream, which may trail it): a sink left without one fails after the
    stall timeout even while the worker answers health checks; a finished one never."""

    async def run() -> None:
        watch = SinkWatch(stall_timeout=30.0)
        worker = Worker()
        lost, done = Sink(worker, "stream"), Sink(worker, "stream")
        watch.add(lost)
        watch.add(done)
        lost.put(chunk(1))
        done.put(common_pb2.GenerateChunk(token_ids=[2], finish=common_pb2.Finish()))
        now = time.monotonic()
        lost.call_ended = done.call_ended = now
        worker.last_heard = now + 40  # healthy: it answers
        watch.sweep(now + 29)
        assert lost.error is None
        watch.sweep(now + 31)
        assert isinstance(lost.error, WorkerStalled)
        assert str(lost.error) == "the worker's call ended without the request's finish"
        assert done.error is None
        watch.discard(lost)
        watch.discard(done)

    asyncio.run(run())


def test_pump_call_marks_when_the_call_ended_well() -> None:
    class Call:  # a Generate call that ends well with no chunk of its own
        def __aiter__(self) -> Call:
            return self

        async def __anext__(self) -> object:
            raise StopAsyncIteration

    async def run() -> None:
        sink = Sink(Worker(), None)
        await pump_call(Call(), sink)
        assert sink.call_ended is not None and sink.error is None

    asyncio.run(run())
