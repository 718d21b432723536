"""The engine's bounded queue (worker/admission.py): requests past max_running_requests +
max_queued_requests are Overloaded and every finished, aborted or failed request gives
its place back; a constrained request aborted while it compiles ends aborted; a cancelled
score (a cancelled select) aborts every continuation, in process and in the engine
process. One engine of each kind serves the module (dummy:tiny, 2 running + 2 queued)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument, Overloaded
from radixmesh.worker.engine import Engine
from radixmesh.worker.engine_process import EngineProcess
from radixmesh.worker.request import RequestOutput

OPTIONS: dict[str, Any] = {
    "model": "dummy:tiny",
    "dtype": "float32",
    "kv_cache_tokens": 2048,
    "max_running_requests": 2,
    "max_queued_requests": 2,
    "max_num_batched_tokens": 16,
}
LONG = {"max_new_tokens": 500, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(**OPTIONS) as eng:
        yield eng


def _wait(predicate: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _idle(engine: Engine) -> bool:
    return engine.admission.outstanding == 0 and not engine.call(engine.worker.scheduler.has_work)


def test_the_queue_is_bounded_and_every_end_gives_a_place_back(engine: Engine) -> None:
    sinks: list[queue.SimpleQueue[RequestOutput]] = []
    for i in range(4):
        q: queue.SimpleQueue[RequestOutput] = queue.SimpleQueue()
        engine.submit([1, 2, 3 + i], LONG, f"held-{i}", q.put)
        sinks.append(q)
    assert engine.admission.outstanding == 4
    with pytest.raises(Overloaded, match=r"the worker's queue is full \(4 requests, at most 4\)"):
        engine.submit([1, 2, 3], LONG, "one-too-many", lambda out: None)
    with pytest.raises(Overloaded, match="5 requests in one call; the worker queues at most 4"):
        engine.generate(input_ids=[[1]] * 5, sampling_params={"max_new_tokens": 1})
    for i in range(4):
        engine.abort(f"held-{i}")
    _wait(lambda: _idle(engine))
    for q in sinks:  # every request ended with a last output
        out = q.get(timeout=5)
        while not out.finished:
            out = q.get(timeout=5)
    results = engine.generate(input_ids=[[1, 2]] * 4, sampling_params={"max_new_tokens": 2})
    assert isinstance(results, list)
    assert [r["meta_info"]["completion_tokens"] for r in results] == [2, 2, 2, 2]
    assert _idle(engine)


def test_a_bad_request_takes_no_place(engine: Engine) -> None:
    for params in ({"max_new_tokens": -1}, {"regex": "[0-9"}, {"top_logprobs_num": 21}):
        with pytest.raises(InvalidArgument):
            engine.generate(input_ids=[1, 2], sampling_params=params)
    assert engine.admission.outstanding == 0


def test_aborted_while_its_grammar_compiles(engine: Engine) -> None:
    cache = engine.worker.grammars.cache
    release = threading.Event()
    load = cache.backend.load

    def held(data: str | bytes) -> object:
        release.wait(30)
        return load(data)

    cache.backend.load = held  # type: ignore[method-assign]
    outputs: queue.SimpleQueue[RequestOutput] = queue.SimpleQueue()
    errors: list[BaseException] = []
    try:
        params = {"max_new_tokens": 8, "regex": "[a-c]{8}x"}
        engine.submit([1, 2], params, "compiling", outputs.put, on_error=errors.append)
        assert engine.admission.outstanding == 1
        engine.abort("compiling")
        release.set()
        out = outputs.get(timeout=30)
        assert out.finished and out.meta_info.finish is not None
        assert out.meta_info.finish.reason == "abort"
        assert out.new_token_ids == [] and not errors
        _wait(lambda: _idle(engine))
    finally:
        cache.backend.load = load  # type: ignore[method-assign]


def _cancelled_score(scorer: Engine | EngineProcess, busy: Any) -> None:
    """Cancel a 3-continuation score while it runs (prefill chunks of 16 tokens: ~40
    steps each); every continuation must end aborted."""

    async def run() -> None:
        task = asyncio.create_task(scorer.async_score([5] * 600, [[6] * 300, [7] * 300, [8] * 300]))
        deadline = time.monotonic() + 30
        while not busy():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())


def test_a_cancelled_score_aborts_every_continuation(engine: Engine) -> None:
    aborted = engine.get_stats().num_aborted
    _cancelled_score(engine, lambda: engine.admission.outstanding == 3)
    _wait(lambda: _idle(engine))
    assert engine.get_stats().num_aborted == aborted + 3
    scores = asyncio.run(engine.async_score([5, 6], [[7], [8, 9]]))
    assert [len(s) for s in scores] == [1, 2]


def test_a_cancelled_score_aborts_every_continuation_in_the_engine_process() -> None:
    proc = EngineProcess(OPTIONS)
    try:
        _cancelled_score(proc, lambda: len(proc._streams) == 3)
        _wait(lambda: (s := proc.get_stats()).num_running + s.num_waiting == 0)
        assert proc.get_stats().num_aborted == 3
        scores = asyncio.run(proc.async_score([5, 6], [[7], [8, 9]]))
        assert [len(s) for s in scores] == [1, 2]
    finally:
        proc.shutdown()
