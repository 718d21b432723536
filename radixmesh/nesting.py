"""How deeply a JSON text nests, without parsing it (shared by the router, which bounds
request bodies, and the worker, which bounds JSON schemas).

Python's `json` parser recurses per level and raises RecursionError past ~1,000; code
that walks the parsed value may recurse too. Measuring first lets a server refuse deep
input with a clear error instead.
"""

from __future__ import annotations

import re

# A JSON string (escapes included): brackets inside one do not nest. Unrolled (runs of
# plain characters, then one escape): `re` holds the GIL for a whole pass, and a pattern
# that alternates per character took 0.4 s over a 4 MB body, stalling the router's loop.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text` (an unterminated string counts
    to the end). Work is one regex pass plus one step per bracket."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest
