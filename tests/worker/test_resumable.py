"""HeldRequests / OutputLog (worker/resumable.py): following a request's log from an
offset, owners, the grace period and the bytes bound, with scripted outputs and explicit
clock values (no engine, no timing), and the metrics that count them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from radixmesh.errors import InvalidArgument, NotFound
from radixmesh.worker.metrics import WorkerMetrics
from radixmesh.worker.request_output import Finish, MetaInfo, RequestOutput
from radixmesh.worker.resumable import HeldRequests, ResumeConfig


def out(rid: str, ids: list[int], done: int, finished: bool = False) -> RequestOutput:
    """An output of `ids` (text: their digits) after which `done` tokens were made."""
    meta = MetaInfo(rid, prompt_tokens=4, completion_tokens=done, cached_tokens=0)
    if finished:
        meta.finish = Finish("length", length=done)
    text = "".join(str(i) for i in ids)
    return RequestOutput(rid, ids, text, finished, meta)


class Script:
    """An engine stream fed by the test."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[RequestOutput | None] = asyncio.Queue()

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        while (item := await self.queue.get()) is not None:
            yield item

    async def feed(self, *items: RequestOutput) -> None:
        for item in items:
            self.queue.put_nowait(item)
        for _ in range(3):  # the log's reader takes them
            await asyncio.sleep(0)


class Aborts:
    def __init__(self) -> None:
        self.rids: list[str] = []

    def __call__(self, rid: str) -> None:
        self.rids.append(rid)


def test_follow_from_an_offset_joins_what_is_there_then_streams() -> None:
    async def run() -> None:
        held = HeldRequests(ResumeConfig(grace=5.0), Aborts())
        script = Script()
        log = held.start("r", "alice", script.outputs())
        await script.feed(out("r", [1], 1), out("r", [2, 3], 3), out("r", [4], 4))
        assert log.ends == [1, 3, 4]
        resumed = held.attach("r", "alice")
        follow = resumed.follow(1)
        first = await anext(follow)
        assert (first.new_token_ids, first.text_delta) == ([2, 3, 4], "234")
        await script.feed(out("r", [5], 5, finished=True))
        last = await anext(follow)
        assert (last.new_token_ids, last.finished) == ([5], True)
        assert await anext(follow, None) is None
        with pytest.raises(InvalidArgument) as bad:
            log.start_of(2)  # inside a message: no caller can hold that
        assert bad.value.field == "resume_from.offset"
        assert log.start_of(0) == 0 and log.start_of(3) == 2 and log.start_of(5) == 4
        held.close()

    asyncio.run(run())


def test_a_resume_at_the_end_of_a_finished_request_gets_its_finish_again() -> None:
    """The caller had every token but not the call's end (its router died between them):
    the resume must end with the finish, not with nothing."""

    async def run() -> None:
        held = HeldRequests(ResumeConfig(grace=5.0), Aborts())
        script = Script()
        held.start("r", "alice", script.outputs())
        await script.feed(out("r", [1], 1), out("r", [2, 3], 3, finished=True))
        follow = held.attach("r", "alice").follow(3)
        again = await anext(follow)
        assert (again.new_token_ids, again.text_delta, again.finished) == ([], "", True)
        assert again.meta_info.finish == Finish("length", length=3)
        assert again.meta_info.completion_tokens == 3
        assert await anext(follow, None) is None
        held.close()

    asyncio.run(run())


def test_only_the_owner_reaches_a_held_request() -> None:
    async def run() -> None:
        held = HeldRequests(ResumeConfig(), Aborts())
        held.start("r", "alice", Script().outputs())
        with pytest.raises(NotFound):
            held.attach("r", "mallory")
        with pytest.raises(NotFound):
            held.attach("nope", "alice")
        assert held.attach("r", "alice").followers == 2
        held.close()

    asyncio.run(run())


def test_the_grace_aborts_only_unfollowed_unfinished_requests() -> None:
    async def run() -> None:
        aborts = Aborts()
        held = HeldRequests(ResumeConfig(grace=10.0), aborts)
        scripts = {rid: Script() for rid in ("left", "followed", "done")}
        logs = {rid: held.start(rid, "", s.outputs()) for rid, s in scripts.items()}
        await scripts["done"].feed(out("done", [1], 1, finished=True))
        held.detach(logs["left"])
        held.detach(logs["done"])
        t0 = logs["left"].idle_since
        held.sweep(t0 + 9.0)  # within the grace: all kept
        assert set(held.logs) == {"left", "followed", "done"} and aborts.rids == []
        assert held.unfinished == 1
        held.sweep(t0 + 11.0)
        assert aborts.rids == ["left"] and held.expired == 1
        assert set(held.logs) == {"followed"}  # the finished one dropped, not aborted
        assert held.abort("followed") and aborts.rids == ["left", "followed"]
        assert not held.abort("left")  # gone
        held.detach(logs["followed"])
        await scripts["followed"].feed(out("followed", [], 0, finished=True))
        assert not held.abort("followed")  # finished: nothing to end
        held.close()

    asyncio.run(run())


def test_the_bytes_bound_drops_the_oldest_unfollowed_logs() -> None:
    async def run() -> None:
        aborts = Aborts()
        one = out("a", [1] * 8, 8)
        size = 64 + 8 + 8 * 8  # an output's bytes as the log counts them
        held = HeldRequests(ResumeConfig(grace=60.0, max_bytes=2 * size), aborts)
        scripts = [Script() for _ in range(3)]
        logs = [held.start(f"r{i}", "", s.outputs()) for i, s in enumerate(scripts)]
        for i, s in enumerate(scripts):
            await s.feed(out(f"r{i}", one.new_token_ids, 8))
        assert [log.nbytes for log in logs] == [size] * 3
        for log in logs:
            held.detach(log)
        assert set(held.logs) == {"r1", "r2"} and aborts.rids == ["r0"]
        held.close()

    asyncio.run(run())


def test_an_aborted_request_stops_counting_at_once_and_once() -> None:
    """The engine's last output of an aborted request comes a step later; the worker's
    admission must not count it meanwhile (a plain call's request stops counting when the
    call is cancelled), nor count it down twice when that output arrives."""

    async def run() -> None:
        aborts = Aborts()
        held = HeldRequests(ResumeConfig(grace=5.0), aborts)
        script = Script()
        log = held.start("r", "alice", script.outputs())
        other = held.start("s", "alice", Script().outputs())
        await script.feed(out("r", [1], 1))
        held.detach(log)
        assert held.generating == 2
        assert held.abort("r") is True
        assert (aborts.rids, held.generating) == (["r"], 1)
        await script.feed(out("r", [], 1, finished=True))
        assert (log.finished, held.generating) == (True, 1)
        assert held.abort("r") is False
        assert (aborts.rids, held.generating) == (["r"], 1)
        other.cancel()
        held.close()

    asyncio.run(run())


def test_metrics_count_held_streams_resumes_and_expiries() -> None:
    async def run() -> None:
        held = HeldRequests(ResumeConfig(grace=10.0), Aborts())
        metrics = WorkerMetrics(lambda: None, "m")
        metrics.watch_held(held)

        def value(name: str) -> float | None:
            return metrics.registry.get_sample_value(name, {"model_name": "m"})

        def values() -> tuple[float | None, ...]:
            return (
                value("radixmesh_resumable_streams_held"),
                value("radixmesh_resumable_stream_resumes_total"),
                value("radixmesh_resumable_stream_expiries_total"),
            )

        scripts = {rid: Script() for rid in ("resumed", "left", "done")}
        logs = {rid: held.start(rid, "", s.outputs()) for rid, s in scripts.items()}
        assert values() == (0.0, 0.0, 0.0)  # followed by their first calls
        await scripts["done"].feed(out("done", [1], 1, finished=True))
        for log in logs.values():
            held.detach(log)  # every caller's router died
        assert values() == (3.0, 0.0, 0.0)
        again = held.attach("resumed", "")
        assert values() == (2.0, 1.0, 0.0)
        held.sweep(logs["left"].idle_since + 11.0)  # nobody came back for the other two
        assert values() == (0.0, 1.0, 1.0)  # the finished one is dropped, not an expiry
        held.detach(again)
        assert values() == (1.0, 1.0, 1.0)
        held.close()

    asyncio.run(run())


def test_a_finished_request_is_delivering_until_its_call_passes_the_last_output_on() -> None:
    """The log reads the last output (the request stops counting as generating) before
    the following call has passed it on: until that call detaches, the request counts as
    delivering, which a drain waits for (worker/serving.py) before it closes the output
    streams that call writes to."""

    async def run() -> None:
        held = HeldRequests(ResumeConfig(grace=5.0), Aborts())
        script = Script()
        log = held.start("r", "alice", script.outputs())
        follow = log.follow(0)
        assert (held.generating, held.delivering) == (1, 0)
        await script.feed(out("r", [1, 2], 2, finished=True))
        assert log.finished and (held.generating, held.delivering) == (0, 1)
        last = await anext(follow)
        assert last.finished
        held.detach(log)  # the call has sent it
        assert (held.generating, held.delivering) == (0, 0)
        held.close()

    asyncio.run(run())
