"""The grammar backend is built in the background at engine start (GrammarConfig
grammar_warmup), so the first constrained request does not wait for it; a failed build
still fails each request the same way."""

from __future__ import annotations

import json
import time

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.constrained.grammar import GrammarError
from radixmesh.worker.constrained.manager import GrammarManager
from radixmesh.worker.engine import Engine
from tests.worker.factories import make_worker

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
)


@pytest.mark.slow
def test_engine_start_builds_the_backend_before_any_constrained_request(
    smollm2_gguf: object,
) -> None:
    with Engine("smollm2", dtype="float32", kv_cache_tokens=512, max_running_requests=2) as eng:
        grammars = eng.worker.grammars
        build = grammars.build
        assert build is not None  # started by Engine(...), not by a request
        cache = build.result(timeout=60)
        assert grammars.ready
        assert cache is grammars.cache
        assert cache.backend.name == "xgrammar"
        assert (len(cache), cache.misses, grammars.stats.requests) == (0, 0, 0)
        t0 = time.perf_counter()
        out = eng.generate(
            "Give me a person as JSON:",
            {"temperature": 0, "max_new_tokens": 8, "json_schema": SCHEMA},
        )
        first = time.perf_counter() - t0
        assert isinstance(out, dict)
        assert out["text"] == '{"name": "John", "age'
        assert grammars.build is build  # the request used the warm backend
        assert (len(cache), cache.misses) == (1, 1)
        print(f"first JSON-schema request after a warm backend: {first:.3f} s")


def test_grammar_warmup_false_builds_on_first_use() -> None:
    worker = make_worker(grammar_warmup=False)  # dummy:tiny, byte tokenizer
    grammars = worker.grammars
    assert (grammars.build, grammars.ready) == (None, False)
    worker.grammars.validate(SamplingParams(regex="[0-9]+"))
    assert grammars.build is not None and grammars.ready
    assert grammars.cache.misses == 1


def test_default_worker_warms_up() -> None:
    worker = make_worker()
    assert worker.config.grammar.grammar_warmup is True
    build = worker.grammars.build
    assert build is not None
    assert build.result(timeout=60) is worker.grammars.cache


def test_failed_warmup_fails_each_request_the_same_way() -> None:
    mgr = GrammarManager(object(), 32, [0])  # token bytes unknown
    build = mgr.warmup()
    assert mgr.warmup() is build
    with pytest.raises(GrammarError) as failed:
        build.result(timeout=10)
    assert str(failed.value) == "constrained decoding needs a tokenizer whose token bytes are known"
    for field, params in (
        ("regex", SamplingParams(regex="a")),
        ("ebnf", SamplingParams(ebnf='root ::= "a"')),
    ):
        with pytest.raises(InvalidArgument) as err:
            mgr.validate(params)
        assert err.value.field == field
        assert err.value.message == (
            f"invalid {'regex' if field == 'regex' else 'EBNF grammar'}: "
            "constrained decoding needs a tokenizer whose token bytes are known"
        )
        assert mgr.build is None  # not kept: the next use tries again
    assert not mgr.ready


def test_a_warm_worker_reports_ready_with_the_backend_built() -> None:
    """With the model's warm-up on, the build started beside the rest of the start has
    finished when the worker is ready (left running, it shared the GIL with the first
    batch); without the warm-up it goes on in the background."""
    warm = make_worker(device="cpu", warmup=True)
    assert warm.warmup is not None
    assert warm.grammars.build is not None and warm.grammars.build.done()
    assert warm.grammars.ready
    cold = make_worker(device="cpu")
    assert cold.warmup is None and cold.grammars.build is not None
    assert cold.grammars.build.result(timeout=60) is cold.grammars.cache
