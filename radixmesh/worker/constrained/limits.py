"""Bounds on what a constraint may be, checked before anything compiles.

A constraint's compile cost grows with its size, its nesting and its repetition counts,
and a client chooses all three. These checks are cheap (one pass over at most `max_bytes`
of text) and turn a constraint past a bound into an `InvalidArgument` naming the field,
before it reaches a compiler. The compile pool's time and memory limits
(compile_pool.py) stop what gets past them.

- size: the constraint's UTF-8 bytes (choices: all of them together);
- nesting: JSON containers of a schema; groups and brackets of a regex or EBNF grammar
  (outside quoted strings and character classes);
- repetition: `{n}`, `{n,m}` counts in a regex or grammar, and a schema's min/max
  length / items / properties, and the regexes in its `pattern`s;
- compiled size: what the grammar is estimated to weigh once compiled and serialized
  (cost.py: numeric ranges, unrolled items and repetitions grow it with the square of
  the schema), at most `max_compiled_bytes`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.nesting import json_depth
from radixmesh.worker.constrained.cost import CompileCost, estimate, schema_cost

_LABELS = {
    "regex": "regex",
    "json_schema": "JSON schema",
    "ebnf": "EBNF grammar",
    "choices": "choices",
}
_REPEAT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_SCHEMA_COUNTS = (
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
    "minContains", "maxContains",
)  # fmt: skip


@dataclass(frozen=True)
class ConstraintLimits:
    max_bytes: int = 128 * 1024
    max_depth: int = 128
    max_repetition: int = 10_000
    max_compiled_bytes: int = 32 << 20

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_depth", "max_repetition", "max_compiled_bytes"):
            if getattr(self, name) < 1:
                raise InvalidArgument(name, f"must be >= 1, got {getattr(self, name)}")

    def check(self, kind: str, text: str) -> CompileCost:
        """The estimated cost of compiling `text` (a constraint of `kind`);
        InvalidArgument(kind, why) when it is past a bound."""
        label = _LABELS.get(kind, kind)
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_bytes:
            raise InvalidArgument(
                kind, f"the {label} is {size} bytes; at most {self.max_bytes} are allowed"
            )
        cost = None
        if kind == "json_schema":
            schema = self._check_schema(text)
            cost = None if schema is None else schema_cost(schema, size)
        elif kind in ("regex", "ebnf"):
            self._check_pattern(kind, label, text)
        cost = cost or estimate(kind, text)
        if cost.serialized_bytes > self.max_compiled_bytes:
            raise InvalidArgument(kind, f"the {label} {too_large(cost, self.max_compiled_bytes)}")
        return cost

    def _check_pattern(self, field: str, label: str, text: str) -> None:
        depth = pattern_depth(text, regex=field != "ebnf")
        if depth > self.max_depth:
            raise InvalidArgument(
                field,
                f"the {label} nests {depth} levels deep; at most {self.max_depth} are allowed",
            )
        for m in _REPEAT.finditer(text):
            count = max(int(m.group(1)), int(m.group(2) or 0))
            if count > self.max_repetition:
                raise InvalidArgument(
                    field,
                    f"the {label} repeats {count} times ({m.group(0)}); "
                    f"at most {self.max_repetition} are allowed",
                )

    def _check_schema(self, text: str) -> Any:
        """The parsed schema (None when it is not JSON) after its depth and counts."""
        depth = json_depth(text)
        if depth > self.max_depth:
            raise InvalidArgument(
                "json_schema",
                f"the JSON schema nests {depth} levels deep; at most {self.max_depth} are allowed",
            )
        try:
            schema = json.loads(text)
        except ValueError:
            return None  # not JSON: the compiler says what is wrong, in its words
        for key, value in _items(schema):
            if key in _SCHEMA_COUNTS and isinstance(value, int) and value > self.max_repetition:
                raise InvalidArgument(
                    "json_schema",
                    f"{key} is {value}; at most {self.max_repetition} is allowed",
                )
            if key == "pattern" and isinstance(value, str):
                self._check_pattern("json_schema", "JSON schema's pattern", value)
        return schema


def too_large(cost: CompileCost, limit: int) -> str:
    """Why a constraint estimated at `cost` is refused, read on from "the <label> "."""
    why = (
        f"would compile to a grammar of about {_mib(cost.serialized_bytes)} "
        f"(~{cost.rules} rules); at most {_mib(limit)} are allowed"
    )
    if cost.ranges:
        why += (
            f": its {cost.ranges} numeric ranges (minimum / maximum, {cost.range_digits} "
            "digits in all) expand digit by digit; use fewer or narrower ranges"
        )
    return why


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n < 10 << 20 else f"{n >> 20} MiB"


def pattern_depth(text: str, *, regex: bool) -> int:
    """The deepest nesting of groups in a regex (escapes and character classes skipped)
    or an EBNF grammar (quoted strings and character classes skipped)."""
    depth = deepest = 0
    quote: str | None = None
    in_class = escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif quote is not None:
            quote = None if ch == quote else quote
        elif ch == "[":
            in_class = True
        elif not regex and ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


def _items(value: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) of every object in a parsed JSON value, without recursion."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                yield k, item
                stack.append(item)
        elif isinstance(v, list):
            stack.extend(v)
