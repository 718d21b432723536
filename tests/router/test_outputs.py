"""The router's sinks: chunks taken together, failures after the chunks, stalls judged by
the worker's last word, shutdown failing every sink."""

from __future__ import annotations

import asyncio
import time

import pytest

from radixmesh.errors import Unavailable
from radixmesh.router.outputs import Sink, SinkWatch, WorkerStalled
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
