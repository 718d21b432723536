"""The engine's typed commands, carried out on its scheduler thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from radixmesh.errors import Unavailable
from radixmesh.worker.commands import (
    AddRequest,
    AddRequests,
    Command,
    FlushCache,
    GetStats,
    Inspect,
)
from radixmesh.worker.engine import Engine


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    eng = Engine("dummy:tiny", device="cpu")
    yield eng
    eng.shutdown()


def test_queries_run_on_the_scheduler_thread_and_answer(engine: Engine) -> None:
    names = engine.call(lambda: threading.current_thread().name)
    assert names == "radixmesh-scheduler"
    assert engine._ask(FlushCache()) is True  # nothing in flight
    assert engine._ask(GetStats()) == engine.get_stats()


def test_a_failing_query_answers_its_error_and_the_thread_serves_on(engine: Engine) -> None:
    def boom() -> None:
        raise KeyError("inspected")

    with pytest.raises(KeyError, match="inspected"):
        engine._ask(Inspect(boom))
    out = engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2,
                                                               "ignore_eos": True})  # fmt: skip
    assert isinstance(out, dict) and len(out["output_ids"]) == 2


def _posted(engine: Engine) -> list[Command]:
    """Every command posted from now on (the list fills as they are)."""
    posted: list[Command] = []
    post = engine._post

    def spy(cmd: Command) -> None:
        posted.append(cmd)
        post(cmd)

    engine._post = spy  # type: ignore[method-assign]
    return posted


PARAMS = {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0.0}


def test_a_calls_requests_reach_the_scheduler_in_one_message(engine: Engine) -> None:
    posted = _posted(engine)
    try:
        outs = engine.generate(input_ids=[[5, 6, 7], [5, 6, 8], [9]], sampling_params=PARAMS)
        aouts = asyncio.run(engine.async_generate(input_ids=[[5, 6], [7]], sampling_params=PARAMS))
    finally:
        del engine._post
    adds = [c for c in posted if isinstance(c, AddRequest | AddRequests)]
    assert [type(c) for c in adds] == [AddRequests, AddRequests]
    assert isinstance(adds[0], AddRequests) and isinstance(adds[1], AddRequests)
    assert [r.prompt_ids for r in adds[0].reqs] == [(5, 6, 7), (5, 6, 8), (9,)]
    assert [r.prompt_ids for r in adds[1].reqs] == [(5, 6), (7,)]
    assert isinstance(outs, list) and isinstance(aouts, list)
    assert [len(o["output_ids"]) for o in outs + aouts] == [3] * 5
    assert engine.admission.outstanding == 0


def test_a_refused_batch_gives_its_places_back(engine: Engine) -> None:
    engine._fatal = "the scheduler is gone"  # _post refuses, as for a dead thread
    try:
        with pytest.raises(Unavailable, match="the scheduler is gone"):
            engine.generate(input_ids=[[5, 6], [7]], sampling_params=PARAMS)
    finally:
        engine._fatal = None
    assert engine.admission.outstanding == 0
    out = engine.generate(input_ids=[5, 6], sampling_params=PARAMS)
    assert isinstance(out, dict) and len(out["output_ids"]) == 3
