from __future__ import annotations

from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.sampling_params import SamplingParams


def test_defaults_and_from_dict() -> None:
    p = SamplingParams.from_dict({"temperature": 0, "stop": "END", "stop_token_ids": [5]})
    assert p.temperature == 0 and p.is_greedy
    assert p.stop == ("END",) and p.stop_token_ids == (5,)
    assert SamplingParams.from_dict(None) == SamplingParams()
    assert SamplingParams.from_dict({"seed": None}).seed is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n": 0}, "n"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"frequency_penalty": 3.0}, "frequency_penalty"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"seed": -1}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"max_new_tokens": 1.5}, "max_new_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"top_k": 0}, "top_k"),
        ({"regex": "a", "json_schema": "{}"}, "json_schema"),
        ({"choices": []}, "choices"),
        ({"logprob_start_len": -1}, "logprob_start_len"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {1: 100.5}}, "logit_bias"),
        ({"logit_bias": {1: "up"}}, "logit_bias"),
        ({"logit_bias": {i: 1 for i in range(1025)}}, "logit_bias"),
    ],
)
def test_invalid_values_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        SamplingParams.from_dict(kwargs)
    assert err.value.field == field


def test_not_a_dict() -> None:
    with pytest.raises(InvalidArgument) as err:
        SamplingParams.from_dict([1, 2])  # type: ignore[arg-type]
    assert err.value.field == "sampling_params"


def test_validate_for_model_limits() -> None:
    p = SamplingParams(max_new_tokens=10, logprob_start_len=5)
    p.validate_for(prompt_len=6, context_len=16, vocab_size=100)
    with pytest.raises(InvalidArgument, match="logprob_start_len"):
        p.validate_for(prompt_len=5, context_len=16, vocab_size=100)
    with pytest.raises(InvalidArgument, match="max_new_tokens"):
        p.validate_for(prompt_len=7, context_len=16, vocab_size=100)


def test_logit_bias_is_kept_as_sorted_pairs() -> None:
    p = SamplingParams.from_dict({"logit_bias": {"7": -100, 3: 2.5}})
    assert p.logit_bias == ((3, 2.5), (7, -100))
    # A list, unsorted, as untyped callers pass it: the constructor makes sorted pairs.
    unsorted: Any = [(7, -100), (3, 2.5)]
    assert hash(p) == hash(SamplingParams(logit_bias=unsorted))
    with pytest.raises(InvalidArgument, match="logit_bias"):
        p.validate_for(prompt_len=1, context_len=256, vocab_size=7)


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"stop": ["x"] * 33}, "stop", "at most 32 stop strings, got 33"),
        ({"stop": ["x" * 1001]}, "stop", "a stop string has 1001 characters; at most 1000"),
        ({"stop_token_ids": [1] * 1025}, "stop_token_ids", "at most 1024 ids, got 1025"),
        ({"max_new_tokens": 2**32}, "max_new_tokens", "must be <= 4294967295, got 4294967296"),
        ({"seed": 10**100}, "seed", "must be <= 18446744073709551615, got a huge integer"),
        ({"top_k": 2**31}, "top_k", "must be <= 2147483647, got 2147483648"),
        ({"temperature": float("inf")}, "temperature", "must be a finite number, got inf"),
        ({"top_p": 10**400}, "top_p", "must be a finite number, got a huge integer"),
        ({"regex": 123}, "regex", "must be a string, got int"),
        ({"json_schema": {"type": "object"}}, "json_schema", "must be a string, got dict"),
        ({"choices": ["a", 5]}, "choices", "choices must be non-empty strings, got 5"),
        ({"stop": ["x" * 200, 7]}, "stop", "stop strings must be non-empty strings, got 7"),
    ],
)
def test_bounds_and_types_name_the_field(
    kwargs: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        SamplingParams.from_dict(kwargs)
    assert (err.value.field, err.value.message) == (field, message)


def test_top_logprobs_are_capped_by_the_server() -> None:
    p = SamplingParams(return_logprob=True, top_logprobs_num=21)
    with pytest.raises(InvalidArgument) as err:
        p.validate_for(prompt_len=2, context_len=64, vocab_size=100)
    assert (err.value.field, err.value.message) == ("top_logprobs_num", "at most 20, got 21")
    p.validate_for(prompt_len=2, context_len=256, vocab_size=100, max_top_logprobs=50)


def test_stop_regex_is_checked_and_named() -> None:
    assert SamplingParams(stop_regex=r"\d+").stop_regex == (r"\d+",)  # type: ignore[arg-type]
    assert SamplingParams(stop_regex=["a", "b+"]).stop_regex == ("a", "b+")  # type: ignore[arg-type]
    cases = [
        ("(", "stop_regex: '(' is not a regular expression: missing ) at position 1"),
        ([""], "stop_regex: patterns must be non-empty strings, got ''"),
        (["a"] * 9, "stop_regex: at most 8 patterns, got 9"),
        (["x" * 257], "stop_regex: a pattern has 257 characters; at most 256"),
        (5, "stop_regex: expected a list, got int"),
    ]
    for value, message in cases:
        with pytest.raises(InvalidArgument) as e:
            SamplingParams(stop_regex=value)  # type: ignore[arg-type]
        assert (e.value.field, str(e.value)) == ("stop_regex", message)


def test_every_field_is_described_once() -> None:
    import dataclasses

    from radixmesh.sampling_params import FIELD_DOCS

    names = [f.name for f in dataclasses.fields(SamplingParams)]
    assert sorted(FIELD_DOCS) == sorted(names)
    assert all(doc.endswith(".") and len(doc) > 10 for doc in FIELD_DOCS.values())
