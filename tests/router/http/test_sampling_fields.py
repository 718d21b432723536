"""The HTTP request models' sampling fields, taken from SamplingParams."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.anthropic.requests import MessagesRequest
from radixmesh.router.http.openai.convert import validate
from radixmesh.router.http.openai.requests import PARAMS, ChatCompletionRequest, CompletionRequest
from radixmesh.router.http.openai.responses_api.requests import ResponsesRequest
from radixmesh.router.http.sampling_fields import json_type, with_sampling_fields
from radixmesh.router.http.sglang_protocol import parse_generate
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


_MESSAGES = [{"role": "user", "content": "hi"}]
_BODIES: dict[str, tuple[type[BaseModel], dict[str, Any]]] = {
    "completions": (CompletionRequest, {"model": "m", "prompt": "hi"}),
    "chat": (ChatCompletionRequest, {"model": "m", "messages": _MESSAGES}),
    "responses": (ResponsesRequest, {"model": "m", "input": "hi"}),
    "messages": (MessagesRequest, {"model": "m", "max_tokens": 4, "messages": _MESSAGES}),
}


@pytest.mark.parametrize(
    ("api", "field", "value", "message"),
    [
        ("completions", "temperature", 1e308, "less than or equal to 2"),
        ("chat", "temperature", 1e308, "less than or equal to 2"),
        ("chat", "temperature", 2.01, "less than or equal to 2"),
        ("chat", "temperature", -0.5, "greater than or equal to 0"),
        ("chat", "top_p", 1.5, "less than or equal to 1"),
        ("chat", "presence_penalty", 2.5, "less than or equal to 2"),
        ("completions", "frequency_penalty", -3, "greater than or equal to -2"),
        ("responses", "temperature", 1e308, "less than or equal to 2"),
        ("responses", "top_p", 1.01, "less than or equal to 1"),
        ("messages", "temperature", 1.5, "less than or equal to 1"),  # Anthropic's: 0 to 1
        ("messages", "top_p", 2, "less than or equal to 1"),
    ],
)
def test_each_api_holds_its_sampling_fields_to_its_ranges(
    api: str, field: str, value: float, message: str
) -> None:
    model, body = _BODIES[api]
    with pytest.raises(InvalidArgument) as e:
        validate(model, {**body, field: value}, strict=True)
    assert (e.value.field, e.value.message) == (field, f"Input should be {message}")


@pytest.mark.parametrize(
    ("api", "fields"),
    [
        (
            "chat",
            {"temperature": 2.0, "top_p": 1.0, "presence_penalty": -2, "frequency_penalty": 2},
        ),
        ("completions", {"temperature": 0, "top_p": 0.5}),
        ("responses", {"temperature": 2.0, "top_p": 1.0}),
        ("messages", {"temperature": 1.0, "top_p": 1.0}),
    ],
)
def test_the_ends_of_each_range_are_taken(api: str, fields: dict[str, float]) -> None:
    model, body = _BODIES[api]
    parsed = validate(model, {**body, **fields}, strict=True)
    assert {name: getattr(parsed, name) for name in fields} == fields


def test_sglang_keeps_sampling_params_ranges() -> None:
    # SGLang's native API: any finite temperature >= 0, as SamplingParams (and SGLang) take.
    body = {"input_ids": [1, 2], "sampling_params": {"temperature": 5.0}}
    params = parse_generate(body, tokenizer=None).outputs[0].params  # type: ignore[arg-type]
    assert params.temperature == 5.0
    with pytest.raises(InvalidArgument, match="finite") as e:
        parse_generate({"input_ids": [1], "sampling_params": {"temperature": float("inf")}}, None)  # type: ignore[arg-type]
    assert e.value.field == "sampling_params.temperature"
    schema = ChatCompletionRequest.model_json_schema()["properties"]["temperature"]
    assert schema["anyOf"][0] == {"maximum": 2.0, "minimum": 0.0, "type": "number"}
