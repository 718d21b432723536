"""Output constraints on completions and chat in OpenAI's, SGLang's and vLLM's dialects:
each maps onto the worker's constraint and remembers the field it came from; two are a 400
naming the second; what cannot be honoured is a 400 naming it; unknown fields are refused
unless the router is lenient."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.openai.convert import Generation, parse_chat, parse_completion
from radixmesh.tokenizer import ByteTokenizer

TOK = ByteTokenizer(256, eos_token_ids=[0])
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
SCHEMA_TEXT = json.dumps(SCHEMA)
ANY_OBJECT = '{"type": "object"}'
TAG_FORMAT = {"type": "const_string", "value": "ok"}
TAG_TEXT = json.dumps({"type": "structural_tag", "format": TAG_FORMAT})
WEATHER = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
}


def parse(route: str, strict: bool = True, **fields: Any) -> Generation:
    if route == "chat":
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
        return parse_chat(body, tokenizer=TOK, context_length=256, strict=strict)
    body = {"model": "m", "prompt": "hi", **fields}
    return parse_completion(body, tokenizer=TOK, context_length=256, strict=strict)


def constraint(gen: Generation) -> tuple[str | None, Any, str | None]:
    """(the worker's constraint, its value, the request field it names in errors)."""
    params = gen.params[0]
    kind = params.WhichOneof("constraint")
    if kind is None:
        return None, None, None
    value = list(params.choices.choices) if kind == "choices" else getattr(params, kind)
    return kind, value, gen.openai_field(kind)


def refused(route: str, **fields: Any) -> tuple[str, str]:
    with pytest.raises(InvalidArgument) as e:
        parse(route, **fields)
    return e.value.field, e.value.message


ROUTES = pytest.mark.parametrize("route", ["completions", "chat"])


@ROUTES
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"response_format": {"type": "text"}}, (None, None, None)),
        (
            {"response_format": {"type": "json_object"}},
            ("json_schema", ANY_OBJECT, "response_format"),
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA},
                }
            },
            ("json_schema", SCHEMA_TEXT, "response_format"),
        ),
        (
            {"response_format": {"type": "structural_tag", "format": TAG_FORMAT}},
            ("structural_tag", TAG_TEXT, "response_format"),
        ),
        ({"json_schema": SCHEMA}, ("json_schema", SCHEMA_TEXT, "json_schema")),
        ({"regex": "[0-9]+"}, ("regex", "[0-9]+", "regex")),
        ({"ebnf": 'root ::= "a"'}, ("ebnf", 'root ::= "a"', "ebnf")),
        ({"guided_json": SCHEMA}, ("json_schema", SCHEMA_TEXT, "guided_json")),
        (
            {"guided_json": '{"type": "string"}'},
            ("json_schema", '{"type": "string"}', "guided_json"),
        ),
        ({"guided_regex": "[a-z]{3}"}, ("regex", "[a-z]{3}", "guided_regex")),
        ({"guided_choice": ["yes", "no"]}, ("choices", ["yes", "no"], "guided_choice")),
        ({"guided_grammar": 'root ::= "b"'}, ("ebnf", 'root ::= "b"', "guided_grammar")),
        (
            {"structured_outputs": {"json": SCHEMA}},
            ("json_schema", SCHEMA_TEXT, "structured_outputs.json"),
        ),
        ({"structured_outputs": {"regex": "x+"}}, ("regex", "x+", "structured_outputs.regex")),
        (
            {"structured_outputs": {"choice": ["a", "b"]}},
            ("choices", ["a", "b"], "structured_outputs.choice"),
        ),
        (
            {"structured_outputs": {"grammar": 'root ::= "c"'}},
            ("ebnf", 'root ::= "c"', "structured_outputs.grammar"),
        ),
        (
            {"structured_outputs": {"json_object": True}},
            ("json_schema", ANY_OBJECT, "structured_outputs.json_object"),
        ),
        ({"structured_outputs": {"json_object": False}}, (None, None, None)),
        (
            {"structured_outputs": {"structural_tag": TAG_TEXT}},
            ("structural_tag", TAG_TEXT, "structured_outputs.structural_tag"),
        ),
    ],
)
def test_each_dialect_maps_onto_the_workers_constraint(
    route: str, fields: dict[str, Any], expected: tuple[str | None, Any, str | None]
) -> None:
    assert constraint(parse(route, **fields)) == expected


@ROUTES
@pytest.mark.parametrize(
    ("fields", "second", "first"),
    [
        (
            {"response_format": {"type": "json_object"}, "guided_regex": "a"},
            "guided_regex",
            "response_format",
        ),
        ({"regex": "a", "ebnf": 'root ::= "a"'}, "ebnf", "regex"),
        ({"regex": "a", "guided_regex": "a"}, "guided_regex", "regex"),
        ({"guided_json": SCHEMA, "guided_choice": ["a"]}, "guided_choice", "guided_json"),
        (
            {"guided_json": SCHEMA, "structured_outputs": {"regex": "a"}},
            "structured_outputs.regex",
            "guided_json",
        ),
        (
            {"structured_outputs": {"regex": "a", "choice": ["a"]}},
            "structured_outputs.choice",
            "structured_outputs.regex",
        ),
        (
            {"structured_outputs": {"json": SCHEMA, "json_object": True}},
            "structured_outputs.json_object",
            "structured_outputs.json",
        ),
    ],
)
def test_two_constraints_are_refused_naming_the_second(
    route: str, fields: dict[str, Any], second: str, first: str
) -> None:
    assert refused(route, **fields) == (
        second,
        f"only one constraint may be given, got {first} and {second}",
    )


def test_a_required_tool_call_refuses_any_other_constraint() -> None:
    field, message = refused("chat", tools=[WEATHER], tool_choice="required", guided_choice=["a"])
    assert (field, message) == (
        "tool_choice",
        "a required tool call cannot be combined with another constraint (guided_choice)",
    )


@ROUTES
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
        (
            {"structured_outputs": {"regex": "a", "whitespace_pattern": ""}},
            "structured_outputs.whitespace_pattern",
        ),
        ({"structured_outputs": {"jsn": SCHEMA}}, "structured_outputs.jsn"),
        (
            {"structured_outputs": {"structural_tag": '{"structures": [], "triggers": []}'}},
            "structured_outputs.structural_tag",
        ),
        ({"structured_outputs": {"structural_tag": "{"}}, "structured_outputs.structural_tag"),
        ({"structured_outputs": "regex"}, "structured_outputs"),
        ({"guided_choice": "yes"}, "guided_choice"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["yes", ""]}, "guided_choice"),
        ({"guided_json": 5}, "guided_json"),
        ({"guided_regex": ["a"]}, "guided_regex"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(
    route: str, fields: dict[str, Any], param: str
) -> None:
    assert refused(route, **fields)[0] == param


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        (
            {"verbosity": "low"},
            "verbosity",
            'only "medium" (the default) is supported: the model sets its length',
        ),
        (
            {"moderation": {"model": "omni-moderation-latest"}},
            "moderation",
            "moderation is not supported",
        ),
    ],
)
def test_chat_fields_that_would_change_the_output_are_refused(
    fields: dict[str, Any], param: str, message: str
) -> None:
    assert refused("chat", **fields) == (param, message)


def test_disable_additional_properties_closes_every_object_that_does_not_say() -> None:
    schema = {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "properties": {"b": {"type": "string"}}},
            "open": {"type": "object", "additionalProperties": True},
            "items": {"type": "array", "items": {"properties": {"c": {"type": "integer"}}}},
        },
    }
    gen = parse("chat", structured_outputs={"json": schema, "disable_additional_properties": True})
    assert json.loads(constraint(gen)[1]) == {
        "type": "object",
        "properties": {
            "inner": {
                "type": "object",
                "properties": {"b": {"type": "string"}},
                "additionalProperties": False,
            },
            "open": {"type": "object", "additionalProperties": True},
            "items": {
                "type": "array",
                "items": {"properties": {"c": {"type": "integer"}}, "additionalProperties": False},
            },
        },
        "additionalProperties": False,
    }
    text = parse(
        "completions",
        structured_outputs={"json_object": True, "disable_additional_properties": True},
    )
    assert constraint(text)[1] == '{"type": "object", "additionalProperties": false}'
    field, _ = refused(
        "chat", structured_outputs={"json": "{", "disable_additional_properties": True}
    )
    assert field == "structured_outputs.json"


@ROUTES
def test_listed_fields_that_do_not_change_the_output_are_accepted(route: str) -> None:
    plain = parse(route, guided_regex="a")
    extras: dict[str, Any] = {
        "guided_decoding_backend": "xgrammar",
        "user": "u",
        "metadata": {"k": "v"},
        "store": False,
        "service_tier": "auto",
        "prompt_cache_key": "k",
        "prompt_cache_options": {"ttl": "30m"},
        "prompt_cache_retention": "24h",
        "safety_identifier": "s",
    }
    assert parse(route, guided_regex="a", **extras).params == plain.params
    options = {"disable_any_whitespace": True, "disable_fallback": True}
    so = parse(route, structured_outputs={"regex": "a", **options})
    assert so.params == plain.params
    if route == "chat":
        assert (
            parse(route, verbosity="medium", reasoning_effort="low").params == parse(route).params
        )


@ROUTES
def test_unknown_fields_pass_only_when_lenient(route: str) -> None:
    assert refused(route, zeta=1, alpha=2) == ("alpha", "unknown or unsupported field 'alpha'")
    assert parse(route, strict=False, zeta=1).params == parse(route).params
