"""Constraint limits: size, nesting and repetition past a bound are InvalidArgument naming
the field, before any compile; what is within the bounds passes untouched."""

from __future__ import annotations

import json

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.worker.constrained.limits import ConstraintLimits, json_depth, pattern_depth

LIMITS = ConstraintLimits(max_bytes=4096, max_depth=8, max_repetition=100)


def _nested(depth: int) -> str:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return json.dumps(schema)


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        ("regex", "a" * 5000, "the regex is 5000 bytes; at most 4096 are allowed"),
        (
            "choices",
            "\x00".join(["é"] * 2100),
            "the choices is 6299 bytes; at most 4096 are allowed",
        ),
        ("regex", "(" * 9 + "a" + ")" * 9, "the regex nests 9 levels deep; at most 8 are allowed"),
        ("ebnf", "root ::= " + "(" * 9 + '"a"' + ")" * 9, "the EBNF grammar nests 9 levels deep"),
        ("regex", "[0-9]{1,101}", "the regex repeats 101 times ({1,101}); at most 100 are allowed"),
        ("regex", "x{ 500 }", "the regex repeats 500 times ({ 500 })"),
        ("ebnf", 'root ::= "a"{200}', "the EBNF grammar repeats 200 times"),
        ("json_schema", _nested(4), "the JSON schema nests 9 levels deep; at most 8 are allowed"),
        ("json_schema", '{"type": "string", "maxLength": 101}', "maxLength is 101; at most 100"),
        ("json_schema", '{"type": "array", "minItems": 1000}', "minItems is 1000; at most 100"),
        (
            "json_schema",
            '{"type": "string", "pattern": "a{1,1000}"}',
            "the JSON schema's pattern repeats 1000 times",
        ),
    ],
)
def test_past_a_bound_is_invalid_argument(kind: str, text: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        LIMITS.check(kind, text)
    assert e.value.field == kind
    assert e.value.message.startswith(message)


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("regex", r"[(]{3}\(\)" + "(a)" * 50),  # classes and escapes do not nest
        ("regex", r"\{1000\}[0-9]{1,100}"),  # an escaped brace is a character
        ("ebnf", 'root ::= "((((((((((" [(]'),  # quoted and classes
        ("json_schema", _nested(3)),
        ("json_schema", json.dumps({"description": "[[[[[[[[[[{{{{{{{{", "maxLength": 100})),
        ("json_schema", "{not json"),  # left to the compiler, which says what is wrong
        ("choices", "yes\x00no"),
    ],
)
def test_within_the_bounds_passes(kind: str, text: str) -> None:
    LIMITS.check(kind, text)


def test_depth_counters() -> None:
    assert json_depth('{"a": [1, {"b": "]]]}}}"}]}') == 3
    assert pattern_depth(r"(a(b)\()[(((]", regex=True) == 2
    assert pattern_depth("root ::= (\"(\" ('a'))", regex=False) == 2


def test_limits_are_checked_when_made() -> None:
    with pytest.raises(InvalidArgument, match="max_depth: must be >= 1, got 0"):
        ConstraintLimits(max_depth=0)
