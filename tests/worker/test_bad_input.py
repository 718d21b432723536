"""Bad input: a ValueError naming the field, raised before anything is scheduled; the
engine keeps serving and no slot leaks."""

from __future__ import annotations

from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from tests.worker.conftest import assert_engine_idle_and_clean

pytestmark = pytest.mark.slow


def _context_len(engine: Engine) -> int:
    return engine.worker.context_len


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("empty prompt", {"prompt": ""}, "prompt", "the prompt is empty"),
    ("empty input_ids", {"input_ids": []}, "input_ids", "non-empty list"),
    ("no prompt at all", {}, "prompt", "exactly one of prompt and input_ids"),
    (
        "negative max_new_tokens",
        {"sampling_params": {"max_new_tokens": -1}},
        "max_new_tokens",
        "must be >= 0, got -1",
    ),
    (
        "temperature < 0",
        {"sampling_params": {"temperature": -0.5}},
        "temperature",
        "must be >= 0, got -0.5",
    ),
    ("top_p = 0", {"sampling_params": {"top_p": 0.0}}, "top_p", "must be in (0, 1], got 0.0"),
    ("top_p > 1", {"sampling_params": {"top_p": 1.5}}, "top_p", "must be in (0, 1], got 1.5"),
    ("top_k < -1", {"sampling_params": {"top_k": -2}}, "top_k", "must be >= -1, got -2"),
    (
        "unknown parameter",
        {"sampling_params": {"temprature": 0.5}},
        "sampling_params.temprature",
        "unknown sampling parameter 'temprature'",
    ),
    (
        "token id outside vocab",
        {"input_ids": [1, 49152]},
        "input_ids",
        "token id 49152 is outside the vocabulary [0, 49152)",
    ),
    ("negative token id", {"input_ids": [-3, 5]}, "input_ids", "token id -3"),
    (
        "min > max new tokens",
        {"sampling_params": {"min_new_tokens": 9, "max_new_tokens": 4}},
        "min_new_tokens",
        "exceeds max_new_tokens",
    ),
    (
        "stop token out of vocab",
        {"sampling_params": {"stop_token_ids": [10**6]}},
        "stop_token_ids",
        "outside the vocabulary",
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "field", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_names_the_field(
    engine: Engine, kwargs: dict[str, Any], field: str, message: str
) -> None:
    if "prompt" not in kwargs and "input_ids" not in kwargs and kwargs:
        kwargs = {"prompt": "Hello", **kwargs}
    with pytest.raises(ValueError) as err:
        engine.generate(**kwargs)
    assert isinstance(err.value, InvalidArgument)
    assert err.value.field == field
    assert message in str(err.value)
    assert str(err.value).startswith(field)
    assert_engine_idle_and_clean(engine)


def test_prompt_plus_max_new_tokens_beyond_context(engine: Engine) -> None:
    ctx = _context_len(engine)
    with pytest.raises(InvalidArgument) as err:
        engine.generate("Hello there", {"max_new_tokens": ctx})
    assert err.value.field == "max_new_tokens"
    assert f"exceeds the context length ({ctx})" in str(err.value)
    assert_engine_idle_and_clean(engine)


def test_one_bad_item_rejects_the_whole_batch_and_the_engine_keeps_serving(
    engine: Engine,
) -> None:
    stats_before = engine.get_stats()
    with pytest.raises(InvalidArgument) as err:
        batch: list[dict[str, Any]] = [{"max_new_tokens": 4}, {"top_p": 2.0}]
        engine.generate(["fine prompt", "another"], batch)
    assert err.value.field == "top_p"
    assert engine.get_stats().prompt_tokens == stats_before.prompt_tokens  # nothing ran
    out = engine.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 3})
    assert isinstance(out, dict) and len(out["output_ids"]) == 3
    assert_engine_idle_and_clean(engine)


def test_param_list_length_mismatch(engine: Engine) -> None:
    with pytest.raises(InvalidArgument) as err:
        engine.generate(["a", "b"], [{"max_new_tokens": 1}])
    assert err.value.field == "sampling_params"
    assert "got 1 sampling params for 2 prompts" in str(err.value)


def test_invalid_constraint_names_its_field(engine: Engine) -> None:
    # Every bad-constraint case: tests/worker/constrained/test_bad_constraints.py
    with pytest.raises(InvalidArgument) as err:
        engine.generate("x", {"regex": "[0-9"})
    assert err.value.field == "regex"
