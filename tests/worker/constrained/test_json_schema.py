"""JSON-schema-constrained generation on the bundled model: every output validates."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixmesh.worker.engine import Engine
from tests.worker.conftest import assert_engine_idle_and_clean
from tests.worker.constrained.schemas import SCHEMAS

pytestmark = pytest.mark.slow


def chat(engine: Engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}])


def test_schema_suite_outputs_validate(engine: Engine) -> None:
    assert len(SCHEMAS) >= 20
    names = sorted(SCHEMAS)
    prompts = [chat(engine, f"Reply with JSON for a sample '{n}' record.") for n in names]
    params = [
        {"temperature": 0, "max_new_tokens": 160, "json_schema": json.dumps(SCHEMAS[n])}
        for n in names
    ]
    outs = engine.generate(prompts, params)
    assert isinstance(outs, list)
    for name, out in zip(names, outs, strict=True):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (name, out)
        jsonschema.validate(json.loads(out["text"]), SCHEMAS[name])
    assert_engine_idle_and_clean(engine)


def test_sampled_outputs_validate(engine: Engine) -> None:
    """Temperature 1 with seeds: random paths through the grammar stay inside it."""
    names = ["nested_object", "array_of_objects", "string_pattern", "enum_mixed"]
    prompts = [chat(engine, f"Reply with JSON for a '{n}' record.") for n in names]
    params = [
        {
            "temperature": 1.0,
            "seed": 7 + i,
            "max_new_tokens": 200,
            "json_schema": json.dumps(SCHEMAS[n]),
        }
        for i, n in enumerate(names)
    ]
    outs = engine.generate(prompts, params)
    assert isinstance(outs, list)
    for name, out in zip(names, outs, strict=True):
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            jsonschema.validate(json.loads(out["text"]), SCHEMAS[name])
        else:  # a random walk may run long: what exists is still a valid prefix
            assert out["meta_info"]["finish_reason"]["type"] == "length", (name, out)
    assert_engine_idle_and_clean(engine)
