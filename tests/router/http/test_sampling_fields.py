"""The HTTP request models' sampling fields, taken from SamplingParams."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from radixmesh.router.http.openai.requests import PARAMS, ChatCompletionRequest
from radixmesh.router.http.sampling_fields import json_type, with_sampling_fields
from radixmesh.sampling_params import FIELD_DOCS


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("max_new_tokens", int),
        ("temperature", float),
        ("ignore_eos", bool),
        ("regex", str),  # str | None in the dataclass: None is the request's "left out"
        ("seed", int),
        ("stop", str | list[str]),  # tuple[str, ...]
        ("stop_token_ids", list[int]),  # tuple[int, ...]
        ("logit_bias", dict[str, float]),
        ("json_schema", str | dict[str, Any]),
    ],
)
def test_json_types_follow_the_dataclass(name: str, want: Any) -> None:
    assert json_type(name) == want


class Base(BaseModel):
    model: str


def test_a_mapped_field_is_added_typed_and_described() -> None:
    made = with_sampling_fields(Base, {"max_tokens": "max_new_tokens", "stop": "stop"}, "Made")
    assert made.__name__ == "Made" and issubclass(made, Base)
    fields = made.model_fields
    assert fields["max_tokens"].description == FIELD_DOCS["max_new_tokens"]
    assert fields["stop"].description == FIELD_DOCS["stop"]
    one = made.model_validate({"model": "m", "max_tokens": 5, "stop": ["a", "b"]})
    assert one.model_dump(exclude_none=True) == {"model": "m", "max_tokens": 5, "stop": ["a", "b"]}
    assert made.model_validate({"model": "m"}).model_dump() == {
        "model": "m", "max_tokens": None, "stop": None
    }  # fmt: skip
    with pytest.raises(ValidationError, match="max_tokens"):
        made.model_validate({"model": "m", "max_tokens": "five"})


def test_openai_requests_carry_every_mapped_field_with_its_description() -> None:
    fields = ChatCompletionRequest.model_fields
    for api_name, sp_name in PARAMS.items():
        assert fields[api_name].description == FIELD_DOCS[sp_name], api_name
    schema = ChatCompletionRequest.model_json_schema()
    assert schema["properties"]["temperature"]["description"] == FIELD_DOCS["temperature"]
