"""Jump-forward's forced tokens run as decode rows (one per token), the shape the decode
CUDA graph replays: the same tokens as the mixed extend step, on CPU with the torch
backend (the worker turns it on only with graphs; these tests turn it on by hand)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from radixmesh.worker.engine import Engine
from radixmesh.worker.model_runner import _one_row_per_token
from tests.worker.conftest import assert_engine_idle_and_clean
from tests.worker.constrained.schemas import schema_requests

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "full_name_of_the_person": {"type": "string", "maxLength": 12},
        "age_of_the_person_in_years": {"type": "integer", "minimum": 0, "maximum": 120},
        "favorite_programming_language": {"type": "string", "maxLength": 8},
    },
    "required": [
        "full_name_of_the_person",
        "age_of_the_person_in_years",
        "favorite_programming_language",
    ],
    "additionalProperties": False,
}


def test_one_row_per_token() -> None:
    rows, prefixes, lens = _one_row_per_token([5, 2, 7], [10, 40, 3], [1, 3, 2])
    assert rows == [5, 2, 2, 2, 7, 7]
    assert prefixes == [10, 40, 41, 42, 3, 4]
    assert lens == [1, 1, 1, 1, 1, 1]


@pytest.fixture(scope="module")
def tiny() -> Iterator[Engine]:
    eng = Engine("dummy:tiny", dtype="float32", kv_cache_tokens=16384, max_running_requests=8)
    yield eng
    eng.shutdown()


def _generate(
    eng: Engine, prompts: list[str], params: dict[str, Any], rows: int
) -> list[dict[str, Any]]:
    runner = eng.worker.runner
    runner.decode_shaped_max_rows = rows
    try:
        assert eng.flush_cache()
        outs = eng.generate(prompts, params)
    finally:
        runner.decode_shaped_max_rows = 0
    assert isinstance(outs, list)
    return outs


def test_tiny_json_same_tokens_as_mixed_steps(tiny: Engine) -> None:
    prompts = [f"document {i}: " + "x" * (3 * i) for i in range(8)]
    params = {"temperature": 0, "max_new_tokens": 300, "json_schema": json.dumps(SCHEMA)}
    runner = tiny.worker.runner
    mixed = _generate(tiny, prompts, params, rows=0)
    before = runner.num_decode_shaped_steps
    shaped = _generate(tiny, prompts, params, rows=256)
    n_shaped = runner.num_decode_shaped_steps - before
    assert n_shaped > 0
    for a, b in zip(mixed, shaped, strict=True):
        assert a["output_ids"] == b["output_ids"]
        assert set(json.loads(b["text"])) == set(SCHEMA["required"])
        assert b["meta_info"]["forced_tokens"] == a["meta_info"]["forced_tokens"] > 60
    # A step over the cap stays mixed (only small late steps fit 8 rows): same tokens.
    before = runner.num_decode_shaped_steps
    capped = _generate(tiny, prompts, params, rows=8)
    assert runner.num_decode_shaped_steps - before < n_shaped
    assert [o["output_ids"] for o in capped] == [o["output_ids"] for o in mixed]
    assert_engine_idle_and_clean(tiny)


@pytest.mark.slow
def test_smollm2_same_text_as_mixed_steps(engine: Engine) -> None:
    names = ["nested_object", "flat_person", "long_fixed_keys", "array_of_objects"]
    prompts, params = schema_requests(engine.tokenizer, names)
    runner = engine.worker.runner
    assert engine.worker.grammars.jump_forward
    mixed = _generate(engine, prompts, params, rows=0)  # type: ignore[arg-type]
    before = runner.num_decode_shaped_steps
    shaped = _generate(engine, prompts, params, rows=256)  # type: ignore[arg-type]
    assert runner.num_decode_shaped_steps > before
    for a, b in zip(mixed, shaped, strict=True):
        assert a["text"] == b["text"]
        assert a["output_ids"] == b["output_ids"]
    assert_engine_idle_and_clean(engine)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_forced_tokens_replay_the_decode_graph() -> None:
    prompts = [f"document {i}: " + "x" * (3 * i) for i in range(8)]
    params = {"temperature": 0, "max_new_tokens": 300, "json_schema": json.dumps(SCHEMA)}
    outs, replays = {}, {}
    for rows in (True, False):
        eng = Engine(
            "dummy:tiny",
            device="cuda",
            dtype="float32",
            attention_backend="triton",
            kv_cache_tokens=16384,
            max_running_requests=16,
            jump_forward_decode_rows=rows,
            cuda_graph_prefill_reads=0,  # prompts stay eager: only forced tokens differ
        )
        runner = eng.worker.runner
        assert runner.decode_graphs is not None
        # Room for the forced tokens (~30 bytes a key) beside the running rows.
        assert runner.decode_graphs.ladder[-1] == (64 if rows else 16)
        assert runner.decode_shaped_max_rows == (64 if rows else 0)
        res = eng.generate(prompts, params)
        assert isinstance(res, list)
        outs[rows] = [r["output_ids"] for r in res]
        replays[rows] = runner.decode_graphs.num_replays
        assert (runner.num_decode_shaped_steps > 0) == rows
        for r in res:
            assert set(json.loads(r["text"])) == set(SCHEMA["required"])
        eng.shutdown()
    assert outs[True] == outs[False]
    assert replays[True] > replays[False]


def test_tiny_short_prompts_run_as_decode_rows(tiny: Engine) -> None:
    """Admission steps with short prompt chunks take the decode shape too (the worker
    enables it with CUDA graphs, within `cuda_graph_prefill_reads`): same tokens as the
    extend path; over the read budget a step stays mixed."""
    prompts = [f"document {i}: " + "x" * (3 * i) for i in range(8)]
    params = {"temperature": 0, "max_new_tokens": 40}
    runner = tiny.worker.runner
    mixed = _generate(tiny, prompts, params, rows=0)
    runner.decode_shaped_prompt_reads = 65536
    try:
        before = runner.num_decode_shaped_steps
        shaped = _generate(tiny, prompts, params, rows=256)
        n_shaped = runner.num_decode_shaped_steps - before
        # 8 prompts of 13..34 tokens, all admitted in the first step (~1,800 reads).
        assert n_shaped == 1
        assert [o["output_ids"] for o in shaped] == [o["output_ids"] for o in mixed]
        runner.decode_shaped_prompt_reads = 100  # the first prompt alone reads 91
        before = runner.num_decode_shaped_steps
        capped = _generate(tiny, prompts, params, rows=256)
        assert runner.num_decode_shaped_steps == before
        assert [o["output_ids"] for o in capped] == [o["output_ids"] for o in mixed]
    finally:
        runner.decode_shaped_prompt_reads = 0
    assert_engine_idle_and_clean(tiny)
