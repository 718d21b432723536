"""What one client request may be, checked at the router before any worker sees it.

- its counts, on the raw JSON before any model validates it or a template renders it
  (`check_counts`): messages, tools, and token ids (all prompts together, and each prompt
  within the model's context). A 3.4 MB chat of 100k messages cost the router ~10 s of
  pydantic, chat template and tokenizer before a 400 that blamed `max_tokens`; checked
  here it is refused in milliseconds, naming `messages` (docs/reliability.md);
- the prompt text, in UTF-8 bytes, before it is tokenized (`check_prompt_bytes` walks the
  fields a prompt travels in, all together: OpenAI's `prompt`, `messages`, `tools` (their
  definitions are written into the prompt) and `input`, SGLang's `text`, Anthropic's
  `system` and the Responses API's `instructions`);
- the outputs it asks for: prompts x n (`check_choices`), and top logprobs per token;
- its JSON: parsed off the event loop when large, nesting refused past `MAX_JSON_DEPTH`
  (Python's parser would raise RecursionError) with a 400 naming the body.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.nesting import json_depth

# Prompt fields of the HTTP APIs (OpenAI's chat, completions and Responses, Anthropic's
# Messages, SGLang's native one), and `tools`, whose definitions the chat template writes
# into the prompt.
PROMPT_FIELDS = ("prompt", "messages", "tools", "input", "text", "system", "instructions")
# Fields that may hold token ids: a list of ids, or a list of such lists (a batch).
TOKEN_FIELDS = ("prompt", "input", "input_ids", "tokens")
# Those that are prompts, each held to the model's context (`tokens`: /detokenize's ids).
_PROMPT_TOKEN_FIELDS = ("prompt", "input", "input_ids")
MAX_JSON_DEPTH = 200
MAX_REQUEST_ID = 256  # characters of a client's request id (gRPC request_id, /generate rid)
# Bodies up to this size are parsed on the event loop (a thread costs more than they do).
_INLINE_JSON_BYTES = 64 * 1024


@dataclass(frozen=True)
class RequestLimits:
    """Defaults (RouterConfig's, with their reasons there) are far above real use: they
    bound the work one request can make, not what a client may legitimately send."""

    max_prompt_bytes: int = 4 * 1024 * 1024
    max_choices: int = 256
    max_top_logprobs: int = 20
    max_messages: int = 4096
    max_tools: int = 512
    max_prompt_tokens: int = 1 << 20

    def check_body(self, body: Any, context_length: int | None = None) -> None:
        """The counts, then the prompt's bytes: the counts are O(1) per field (a length)
        while the bytes walk every string."""
        self.check_counts(body, context_length)
        self.check_prompt_bytes(body)

    def check_counts(self, body: Any, context_length: int | None = None) -> None:
        """InvalidArgument naming the field whose list is too long: `messages` (and the
        Responses API's `input` items), `tools`, the token ids of `prompt` / `input` /
        `input_ids` / `tokens` (all together past `max_prompt_tokens`; one prompt past
        `context_length`, as `input_ids[3]`). Reads list lengths only; what the lists hold
        is left to the parsers."""
        if not isinstance(body, dict):
            return
        for name, cap in (("messages", self.max_messages), ("tools", self.max_tools)):
            value = body.get(name)
            if isinstance(value, list) and len(value) > cap:
                raise InvalidArgument(name, f"{len(value)} {name}; at most {cap} per request")
        for name in TOKEN_FIELDS:
            value = body.get(name)
            if isinstance(value, list) and value and isinstance(value[0], dict):
                # The Responses API's input items: messages by another name.
                if name == "input" and len(value) > self.max_messages:
                    raise InvalidArgument(
                        name, f"{len(value)} items; at most {self.max_messages} per request"
                    )
            elif isinstance(value, list):
                context = context_length if name in _PROMPT_TOKEN_FIELDS else None
                self._check_token_lists(name, value, context)

    def _check_token_lists(self, name: str, value: list[Any], context: int | None) -> None:
        if value and not isinstance(value[0], list | str):
            lists = [(name, value)]  # one prompt of token ids
        else:  # a batch: its lists of ids (its strings are text, counted in bytes)
            lists = [(f"{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, list)]
        total = 0
        for where, ids in lists:
            if context is not None and len(ids) > context:
                raise InvalidArgument(
                    where,
                    f"{len(ids)} token ids; the model's context is {context} tokens",
                )
            total += len(ids)
        if total > self.max_prompt_tokens:
            raise InvalidArgument(
                name, f"{total} token ids; at most {self.max_prompt_tokens} per request"
            )

    def check_prompt_bytes(self, body: Any) -> None:
        """InvalidArgument naming the prompt field where the strings of the prompt fields
        together pass `max_prompt_bytes` (a body that is not an object is left to the
        parser). Keys count too: a tool's schema writes them into the prompt."""
        if not isinstance(body, dict):
            return
        total = 0
        for name in PROMPT_FIELDS:
            if name in body:
                total += text_bytes(body[name], self.max_prompt_bytes - total)
                if total > self.max_prompt_bytes:
                    raise InvalidArgument(
                        name,
                        f"more than {self.max_prompt_bytes} bytes of prompt text (counted {total})",
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


def check_prompt_fits(field: str, tokens: int, context_length: int, max_new_tokens: int) -> None:
    """A tokenized prompt leaves room for a generated token when it asks for any: when the
    prompt alone fills the context its field is to blame, not `max_tokens` (which
    SamplingParams.validate_for names when only both together are too long)."""
    if tokens + min(max_new_tokens, 1) > context_length:
        raise InvalidArgument(
            field,
            f"the prompt is {tokens} tokens; the model's context is {context_length}, "
            "with room for at least one generated token",
        )


# A text longer than this many characters per context token has its head tokenized first.
_HEAD_CHARS_PER_TOKEN = 16


def encode_within(
    encode: Callable[[str], list[int]], text: str, context_length: int, field: str
) -> list[int]:
    """`encode(text)`, refusing a text far past the context from its head alone: the
    tokenizer's time grows faster than the text (smollm2's: 0.2 s for 200 KB, 11 s for
    4 MB), so a text of more than 16 characters per context token is first encoded up to
    that length, and refused when that head is over twice the context (a cut can split a
    word into more tokens than the whole takes, never a context's worth more)."""
    head = _HEAD_CHARS_PER_TOKEN * context_length
    if len(text) > head:
        tokens = len(encode(text[:head]))
        if tokens > 2 * context_length:
            raise InvalidArgument(
                field,
                f"the prompt is longer than the context: its first {head} characters are "
                f"{tokens} tokens; the model's context is {context_length}",
            )
    return encode(text)


def text_bytes(value: Any, stop_after: int) -> int:
    """UTF-8 bytes of the strings in a JSON value, keys included (counting stops once past
    `stop_after`)."""
    total = 0
    stack = [value]
    while stack and total <= stop_after:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v.encode("utf-8", "surrogatepass"))
        elif isinstance(v, dict):
            stack.extend(v.keys())
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
