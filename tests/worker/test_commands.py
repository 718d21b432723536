"""The engine's typed commands, carried out on its scheduler thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from radixmesh.worker.commands import FlushCache, GetStats, Inspect
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
