"""Jump-forward on the bundled model: valid output either way, the same greedy text,
forced tokens counted, fewer decode steps, no slot leaks."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest

from radixmesh.worker.batch import Batch, ForwardOutput
from radixmesh.worker.engine import Engine
from tests.worker.conftest import assert_engine_idle_and_clean
from tests.worker.constrained.schemas import SCHEMAS, schema_requests

pytestmark = pytest.mark.slow

# Templates whose greedy text is the same with and without jump-forward. Elsewhere the two
# may differ: token-by-token constrained decoding often picks non-canonical splits (`{"`
# then `name` where the tokenizer writes `{"name`), while jump-forward feeds the model
# the canonical tokenization of the forced text, so the contexts differ.
SAME_TEXT = ["nested_object", "flat_person", "ref_defs", "nested_arrays", "bool_and_null"]
OTHERS = ["long_fixed_keys", "array_of_objects", "optional_fields", "top_level_array"]


def run(engine: Engine, names: list[str], jump: bool) -> list[dict[str, object]]:
    engine.worker.grammars.jump_forward = jump
    assert engine.flush_cache()  # the second run must not lean on the first one's KV
    prompts, params = schema_requests(engine.tokenizer, names)
    outs = engine.generate(prompts, params)
    assert isinstance(outs, list)
    return outs


def test_on_and_off_both_valid_and_the_same_text(engine: Engine, jump_forward: None) -> None:
    names = SAME_TEXT + OTHERS
    on = run(engine, names, jump=True)
    off = run(engine, names, jump=False)
    for name, a, b in zip(names, on, off, strict=True):
        for out in (a, b):
            jsonschema.validate(json.loads(out["text"]), SCHEMAS[name])  # type: ignore[arg-type]
        if name in SAME_TEXT:
            assert a["text"] == b["text"], name
        ma, mb = a["meta_info"], b["meta_info"]
        assert isinstance(ma, dict) and isinstance(mb, dict)
        assert ma["forced_tokens"] > 0 and ma["jump_forwards"] > 0
        assert mb["forced_tokens"] == 0 and mb["jump_forwards"] == 0
        assert mb["decode_steps"] == mb["completion_tokens"]
        assert ma["decode_steps"] + ma["forced_tokens"] == ma["completion_tokens"]
        assert ma["decode_steps"] < mb["decode_steps"]
    assert_engine_idle_and_clean(engine)


def test_long_fixed_keys_are_mostly_forced(engine: Engine, jump_forward: None) -> None:
    (out,) = run(engine, ["long_fixed_keys"], jump=True)
    meta = out["meta_info"]
    assert isinstance(meta, dict)
    # Three keys of 24-32 characters: most of the output is template, not model choice.
    assert meta["forced_tokens"] >= 15, meta
    assert meta["forced_tokens"] > meta["decode_steps"], meta


def test_streaming_delivers_forced_text(engine: Engine, jump_forward: None) -> None:
    engine.worker.grammars.jump_forward = True
    schema = json.dumps(SCHEMAS["long_fixed_keys"])
    params = {"temperature": 0, "max_new_tokens": 160, "json_schema": schema}
    prompt = "Customer record as JSON:"
    whole = engine.generate(prompt, params)
    stream = engine.generate(prompt, params, stream=True)
    assert isinstance(stream, Iterator)
    chunks = list(stream)
    assert isinstance(whole, dict)
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert any(len(c["output_ids"]) > 1 for c in chunks)  # a jump arrives as one chunk


def test_text_forced_at_the_start_is_prefilled_not_sampled(
    engine: Engine, jump_forward: None
) -> None:
    engine.worker.grammars.jump_forward = True
    schema = SCHEMAS["long_fixed_keys"]
    prompt = engine.tokenizer.encode_chat([{"role": "user", "content": "JSON please"}])
    params = {"temperature": 0, "max_new_tokens": 160, "json_schema": json.dumps(schema)}
    assert engine.flush_cache()  # the first step then computes the whole prompt
    sched = engine.worker.scheduler
    runner = sched.runner
    first_steps: list[list[int]] = []

    class Recording:
        def forward(self, batch: Batch) -> ForwardOutput:
            item = batch.items[0]
            first_steps.append(item.req.token_ids[item.start : item.start + item.num_new_tokens])
            return runner.forward(batch)

    sched.runner = Recording()
    try:
        out = engine.generate(input_ids=prompt, sampling_params=params)
    finally:
        sched.runner = runner
    assert isinstance(out, dict)
    # The first step computes the prompt and the text forced at the start together, and
    # samples the first free character of the first value.
    start = '{"customer_full_legal_name": "'
    first = first_steps[0]
    assert first[: len(prompt)] == prompt
    assert engine.tokenizer.decode(first[len(prompt) :]) == start
    assert out["text"].startswith(start)
    meta = out["meta_info"]
    assert isinstance(meta, dict)
    assert meta["decode_steps"] == len(first_steps)
    assert meta["decode_steps"] + meta["forced_tokens"] == meta["completion_tokens"]
    assert_engine_idle_and_clean(engine)


def test_max_new_tokens_inside_the_start_text_finishes_without_a_step(
    engine: Engine, jump_forward: None
) -> None:
    engine.worker.grammars.jump_forward = True
    schema = json.dumps(SCHEMAS["long_fixed_keys"])
    steps0 = engine.get_stats().num_steps
    out = engine.generate("JSON:", {"temperature": 0, "max_new_tokens": 3, "json_schema": schema})
    assert isinstance(out, dict)
    assert len(out["output_ids"]) == 3
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert out["meta_info"]["forced_tokens"] == 3
    assert engine.get_stats().num_steps == steps0  # finished before any step
    assert_engine_idle_and_clean(engine)
