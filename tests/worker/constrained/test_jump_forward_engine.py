"""Jump-forward on the bundled model: valid output either way, the same greedy text,
forced tokens counted, fewer decode steps, no slot leaks."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixmesh.worker.engine import Engine
from tests.worker.conftest import assert_engine_idle_and_clean
from tests.worker.constrained.schemas import SCHEMAS

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
    prompts = [
        engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Reply with JSON for a sample '{n}' record."}]
        )
        for n in names
    ]
    params = [
        {"temperature": 0, "max_new_tokens": 160, "json_schema": json.dumps(SCHEMAS[n])}
        for n in names
    ]
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
    chunks = list(engine.generate(prompt, params, stream=True))  # type: ignore[arg-type]
    assert isinstance(whole, dict)
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert any(len(c["output_ids"]) > 1 for c in chunks)  # a jump arrives as one chunk
