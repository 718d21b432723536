"""What a constraint will cost to compile, estimated from its text before it compiles.

What makes xgrammar (0.2.9) slow or large is mostly not the compile itself but the
compiled grammar's serialized form, which crosses from the compile process to the engine
(compile_pool.py): every rule's automaton is written out with a full copy of the
grammar's complete automaton, so the serialized size is about

    rules x characters of the compiled grammar

and grows with the square of the schema. Numeric ranges are the cheapest way to get
there: `{"type": "integer", "minimum": -123456789, "maximum": 987654321}` expands into a
digit-by-digit regex, ~3.5 rules and ~1,200 characters; a number range (six fraction
digits) ~11 rules and ~2,900. Measured on this machine (2-core CPU, 2026-12-02): 50 such
integer ranges serialize to 17 MB in 1.5 s; 200 (a 16 KB schema) to ~270 MB, past the
compile process's 1 GiB (`std::bad_alloc`) after 5-10 s. Arrays with `maxItems` unroll
(one rule per item up to ~130); repetition counts in patterns make the token masks slow
to build (`[a-z]{1,10000}` in a schema: 21 s).

`estimate` walks the parsed schema (or counts a regex's repetitions) in one pass and
models those expansions with per-construct figures fitted to xgrammar's output; it
over- rather than under-estimates. The estimate gates two things:
- past `max_compiled_bytes` the constraint is refused at once (limits.py) instead of
  occupying a compile process until the time or memory limit stops it; the compile
  process measures the real grammar too, before serializing it (xgrammar_backend.py);
- `weight` orders the compile queue: small compiles go first, and costly ones are
  bounded (compile_pool.py).

Refusing is chosen over compiling the schema with its ranges dropped: a grammar without
its bounds would let the model emit numbers the caller's schema forbids, silently.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_REPEAT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
UNROLLED_REPEATS = 130  # xgrammar unrolls bounded repetitions up to about this count
FRACTION_DIGITS = 6  # xgrammar's precision for number ranges
# A repetition count costs mask-building time: this many serialized bytes' worth each.
REPEAT_WEIGHT = 1000
# Compiles estimated at this weight or more are costly (about 0.1 s to serialize on a
# 2-core CPU, seconds from ~10x this): compile_pool.py runs fewer of them at once.
COSTLY_WEIGHT = 1 << 20


@dataclass(frozen=True)
class CompileCost:
    rules: int  # estimated rules of the compiled grammar
    chars: int  # estimated characters of its text
    repeats: int = 0  # sum of repetition counts ({n,m}) in its regexes
    ranges: int = 0  # numeric range constraints (minimum / maximum / exclusive*)
    range_digits: int = 0  # digits of their bounds (number bounds: + fraction digits)

    @property
    def serialized_bytes(self) -> int:
        """About what xgrammar's serialized grammar will weigh (see the module doc)."""
        return self.rules * self.chars

    @property
    def weight(self) -> int:
        """The compile queue's order: small first."""
        return self.serialized_bytes + REPEAT_WEIGHT * self.repeats

    @property
    def costly(self) -> bool:
        return self.weight >= COSTLY_WEIGHT


def estimate(kind: str, text: str) -> CompileCost:
    if kind == "json_schema":
        try:
            schema = json.loads(text)
        except ValueError:
            return CompileCost(1, len(text))  # the compiler says what is wrong, at once
        return schema_cost(schema, len(text))
    if kind in ("regex", "ebnf"):
        rules = 1 + text.count("::=")
        repeats, unrolled = _repeats(text)
        return CompileCost(rules + unrolled, len(text) + 35 * unrolled, repeats)
    return CompileCost(1 + len(text) // 1000, len(text))  # choices, structural tags


def _repeats(pattern: str) -> tuple[int, int]:
    """(sum of repetition counts, items xgrammar unrolls into rules) of a regex."""
    total = unrolled = 0
    for m in _REPEAT.finditer(pattern):
        count = max(int(m.group(1)), int(m.group(2) or 0))
        total += count
        unrolled += min(count, UNROLLED_REPEATS)
    return total, unrolled


def schema_cost(schema: Any, size: int) -> CompileCost:
    """The cost of a parsed JSON schema whose text is `size` characters."""
    rules, chars = 1, 2 * size
    repeats = ranges = digits = 0
    for sub in _subschemas(schema):
        rules += 1
        r, c, d = _range_cost(sub)
        if d:
            ranges += 1
            digits += d
        items = _int(sub.get("maxItems")) or _int(sub.get("minItems"))
        if items:  # unrolled, one rule per item
            r += min(items, UNROLLED_REPEATS)
            c += 60 * min(items, UNROLLED_REPEATS)
        if "minLength" in sub or "maxLength" in sub:
            r, c = r + 2, c + 150
        if isinstance(sub.get("enum"), list):
            r, c = r + 1, c + 2 * len(json.dumps(sub["enum"]))
        pattern = sub.get("pattern")
        if isinstance(pattern, str):  # one automaton, but its masks take time to build
            repeats += _repeats(pattern)[0]
            r, c = r + 1, c + 2 * len(pattern)
        rules += r
        chars += c
    return CompileCost(rules, chars, repeats, ranges, digits)


def _range_cost(sub: dict[str, Any]) -> tuple[int, int, int]:
    """(rules, characters, digits) of a numeric range; zeros for anything else.
    Fitted to xgrammar 0.2.9's output for ranges of 1 to 18 digits (cost.py's doc)."""
    kinds = sub.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    bounds = [
        v
        for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
        if isinstance(v := sub.get(k), (int, float)) and not isinstance(v, bool)
    ]
    number = "number" in kinds
    if not bounds or not (number or "integer" in kinds):
        return 0, 0, 0
    int_digits = sum(_digits(b) for b in bounds)
    if number:  # the fraction's digits (six) are written out per bound as well
        return (
            1 + 5 * len(bounds),
            300 * len(bounds) + 100 * int_digits,
            (int_digits + FRACTION_DIGITS * len(bounds)),
        )
    crosses_zero = min(bounds) < 0 < max(bounds)
    return 1 + 2 * crosses_zero + int_digits // 8, 40 + 80 * int_digits, int_digits


def _digits(value: float) -> int:
    """Digits of a bound's integer part (1 for 0; huge floats by their exponent)."""
    magnitude = abs(value)
    if not math.isfinite(magnitude):
        return 1
    return max(1, math.floor(math.log10(magnitude)) + 1) if magnitude >= 1 else 1


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _subschemas(value: Any) -> Iterator[dict[str, Any]]:
    """Every object in a parsed JSON value, without recursion."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            yield v
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
