"""How deeply a JSON text nests, without parsing it (shared by the router, which bounds
request bodies, and the worker, which bounds JSON schemas).

Python's `json` parser recurses per level and raises RecursionError past ~1,000; code
that walks the parsed value may recurse too. Measuring first lets a server refuse deep
input with a clear error instead.

The work is C-speed passes over the UTF-8 bytes, then a regex over what is left (quotes and
brackets), not over the text: a `re` match per string or per bracket is ~1 µs of Python,
and a chat of 100k messages (300k strings, 200k brackets) took 0.85 s that way.
"""

from __future__ import annotations

import re
from itertools import accumulate

# A string once escapes are gone: its brackets do not nest.
_STRING = re.compile(rb'"[^"]*"')
# Every byte but quotes and brackets (`"`, `[`, `]`, `{`, `}`): none is part of a
# multi-byte UTF-8 sequence, so deleting the others keeps them in order.
_DROP = bytes(b for b in range(256) if b not in b'"[]{}')
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text` (an unterminated string counts
    to the end)."""
    raw = text.encode("utf-8", "surrogatepass")
    # Escapes, left to right as JSON reads them: `\\` pairs, then `\"`; a backslash left
    # escapes another character (`\n`, `\u00e9`), which is no quote or bracket here.
    raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = raw.translate(None, _DROP).replace(b'""', b"")  # `""`: empty, or close+open
    brackets = _STRING.sub(b"", kept)
    if not brackets:
        return 0
    return max(0, max(accumulate(_STEP[b] for b in brackets)))
