"""The output constraint of a completions or chat request, in whichever dialect it came.

Clients ask for structured output in three dialects, all onto the worker's constraints
(SamplingParams' `json_schema`, `regex`, `choices`, `ebnf`, `structural_tag`):

- OpenAI's `response_format`: `json_object`, `json_schema`, `structural_tag` (`text`: none);
- SGLang's `json_schema`, `regex`, `ebnf`;
- vLLM's `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, and their newer
  form `structured_outputs: {json, regex, choice, grammar, json_object, structural_tag}`.

A request gets at most one, whatever the dialects: two are a 400 naming the second (the
worker compiles one grammar per request; obeying both would need their intersection,
which no backend here builds). The field a constraint came from is kept, so a compile
error on the worker names what the client sent (`guided_regex`, not `regex`).

vLLM's JSON options: the grammar's JSON has one fixed layout (`{"k": v, ...}`, no free
whitespace: worker/constrained/xgrammar_backend.py), which obeys
`disable_any_whitespace` either way, so both values are accepted; a `whitespace_pattern`
asks for other whitespace and is refused. `disable_additional_properties` closes every
object of the schema that does not say otherwise, as vLLM does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.openai import requests as rq

# SGLang's constraint fields, declared with the sampling fields (requests.PARAMS).
SGLANG_FIELDS = ("json_schema", "regex", "ebnf")
# vLLM's field -> the worker's constraint.
_GUIDED = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choices",
    "guided_grammar": "ebnf",
}
# `structured_outputs` key -> the worker's constraint (json_object: below).
_STRUCTURED = {
    "json_": "json_schema",
    "regex": "regex",
    "choice": "choices",
    "grammar": "ebnf",
    "structural_tag": "structural_tag",
}
ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class Constraint:
    kind: str  # a SamplingParams constraint field (CONSTRAINT_KINDS)
    value: str | list[str]  # its text (a schema or structural tag as JSON), or the choices
    field: str  # the request field that asked for it


def requested(req: rq.Sampling) -> Constraint | None:
    """The one constraint `req` asks for, or None; a 400 naming the second if two."""
    found = list(_given(req))
    if len(found) > 1:
        first, second = found[0].field, found[1].field
        raise InvalidArgument(second, f"only one constraint may be given, got {first} and {second}")
    return found[0] if found else None


def _given(req: rq.Sampling) -> Iterator[Constraint]:
    if (fmt := response_format(req.response_format)) is not None:
        yield fmt
    for name in SGLANG_FIELDS:  # declared from PARAMS: read by name
        value = getattr(req, name)
        if value is not None:
            yield Constraint(name, _text(value) if name == "json_schema" else value, name)
    if req.guided_whitespace_pattern is not None:
        raise InvalidArgument(
            "guided_whitespace_pattern", "not supported: the JSON grammar's layout is fixed"
        )
    for name, kind in _GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            yield Constraint(kind, _text(value) if kind == "json_schema" else value, name)
    if req.structured_outputs is not None:
        yield from _structured(req.structured_outputs)


def response_format(fmt: rq.ResponseFormat | None) -> Constraint | None:
    """The constraint an OpenAI `response_format` asks for."""
    if fmt is None or fmt.type == "text":
        return None
    name = "response_format"
    if fmt.type == "json_object":
        return Constraint("json_schema", json.dumps(ANY_OBJECT), name)
    if fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise InvalidArgument(f"{name}.json_schema", "needs an object with a `schema` object")
        return Constraint("json_schema", json.dumps(fmt.json_schema.schema_), name)
    if fmt.format is None:
        raise InvalidArgument(f"{name}.format", "a structural_tag needs its `format` object")
    return Constraint("structural_tag", _structural_tag(fmt.format), name)


def _structured(so: rq.StructuredOutputs) -> Iterator[Constraint]:
    name = "structured_outputs"
    if so.whitespace_pattern is not None:
        raise InvalidArgument(
            f"{name}.whitespace_pattern", "not supported: the JSON grammar's layout is fixed"
        )
    for key, kind in _STRUCTURED.items():
        value = getattr(so, key)
        if value is None:
            continue
        field = f"{name}.{key.rstrip('_')}"
        if kind == "structural_tag":
            value = _vllm_structural_tag(value, field)
        elif kind == "json_schema":
            value = _json(value, field, so.disable_additional_properties)
        yield Constraint(kind, value, field)
    if so.json_object:
        value = _json(ANY_OBJECT, f"{name}.json_object", so.disable_additional_properties)
        yield Constraint("json_schema", value, f"{name}.json_object")


def _text(schema: str | dict[str, Any]) -> str:
    return schema if isinstance(schema, str) else json.dumps(schema)


def _json(schema: str | dict[str, Any], field: str, closed: bool | None) -> str:
    """A JSON schema as text; `closed`: every object without `additionalProperties`
    gets `false` (vLLM's `disable_additional_properties`)."""
    if not closed:
        return _text(schema)
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise InvalidArgument(field, f"not valid JSON: {e}") from None
    return json.dumps(_closed(schema))


def _closed(node: Any) -> Any:
    if isinstance(node, list):
        return [_closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _structural_tag(fmt: dict[str, Any]) -> str:
    return json.dumps({"type": "structural_tag", "format": fmt})


def _vllm_structural_tag(text: str, field: str) -> str:
    """vLLM's structural tag (JSON text): xgrammar's `{"type": "structural_tag",
    "format": ...}` is taken; the older `structures` / `triggers` form is not."""
    try:
        tag = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgument(field, f"not valid JSON: {e}") from None
    if not isinstance(tag, dict) or not isinstance(tag.get("format"), dict):
        raise InvalidArgument(
            field,
            'expected xgrammar\'s {"type": "structural_tag", "format": {...}} '
            "(the structures / triggers form is not supported)",
        )
    return _structural_tag(tag["format"])
