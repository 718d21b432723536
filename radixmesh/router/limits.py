"""What one client request may be, checked at the router before any worker sees it.

- the prompt text, in UTF-8 bytes, before it is tokenized (`check_prompt_bytes` walks the
  fields a prompt travels in: OpenAI's `prompt`, `messages` and `input`, SGLang's `text`);
- the outputs it asks for: prompts x n (`check_choices`), and top logprobs per token;
- its JSON: parsed off the event loop when large, nesting refused past `MAX_JSON_DEPTH`
  (Python's parser would raise RecursionError) with a 400 naming the body.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.nesting import json_depth

# Prompt fields of the HTTP APIs (OpenAI's and SGLang's native one).
PROMPT_FIELDS = ("prompt", "messages", "input", "text")
MAX_JSON_DEPTH = 200
# Bodies up to this size are parsed on the event loop (a thread costs more than they do).
_INLINE_JSON_BYTES = 64 * 1024


@dataclass(frozen=True)
class RequestLimits:
    max_prompt_bytes: int = 4 * 1024 * 1024
    max_choices: int = 256
    max_top_logprobs: int = 20

    def check_prompt_bytes(self, body: Any) -> None:
        """InvalidArgument naming the prompt field when its strings together are larger
        than `max_prompt_bytes` (a body that is not an object is left to the parser)."""
        if not isinstance(body, dict):
            return
        for name in PROMPT_FIELDS:
            if name in body:
                size = text_bytes(body[name], self.max_prompt_bytes)
                if size > self.max_prompt_bytes:
                    raise InvalidArgument(
                        name,
                        f"more than {self.max_prompt_bytes} bytes of prompt text (counted {size})",
                    )

    def check_choices(self, field: str, prompts: int, n: int) -> None:
        if prompts * n > self.max_choices:
            raise InvalidArgument(
                field,
                f"{prompts * n} outputs (prompts x n); at most {self.max_choices} per request",
            )

    def check_top_logprobs(self, field: str, k: int | None) -> None:
        if k is not None and k > self.max_top_logprobs:
            raise InvalidArgument(field, f"at most {self.max_top_logprobs}, got {k}")


def text_bytes(value: Any, stop_after: int) -> int:
    """UTF-8 bytes of the strings in a JSON value (counting stops once past `stop_after`)."""
    total = 0
    stack = [value]
    while stack and total <= stop_after:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v.encode("utf-8", "surrogatepass"))
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return total


async def parse_json(raw: bytes) -> Any:
    """A request body as JSON: InvalidArgument("body") when it is not JSON, not UTF-8 or
    nested deeper than MAX_JSON_DEPTH. A large body is parsed on a thread."""
    if len(raw) <= _INLINE_JSON_BYTES:
        return _loads(raw)
    return await asyncio.to_thread(_loads, raw)


def _loads(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgument("body", f"the body is not UTF-8: {e}") from None
    if json_depth(text) > MAX_JSON_DEPTH:
        raise InvalidArgument("body", f"the JSON nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgument("body", f"the body is not valid JSON: {e}") from None
    except RecursionError:  # defensive: json_depth bounds the nesting
        raise InvalidArgument("body", "the JSON nests too deeply") from None
    if _SURROGATE_ESCAPE.search(text) and (where := lone_surrogate(value)) is not None:
        raise InvalidArgument(
            where, "not valid Unicode: it holds a lone surrogate (\\ud800-\\udfff)"
        )
    return value


# A \u escape of a UTF-16 surrogate: only these can put a lone one into a decoded string.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def lone_surrogate(value: Any) -> str | None:
    """The path (`messages[0].content`, a key itself as `keys`) of the first string in a
    JSON value that holds a lone surrogate, or None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if not _encodes(v):
                return path or "body"
        elif isinstance(v, dict):
            for k, item in v.items():
                if not _encodes(k):
                    return f"{path}.keys" if path else "keys"
                stack.append((f"{path}.{k}" if path else k, item))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(v))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
