"""OpenAI's completions and chat completions, as plain values: parse requests, build replies.

Parsing turns a JSON body into an `OpenAIRequest` (token ids per prompt, one validated
`common_pb2.SamplingParams`, the number of choices, streaming options); bad fields raise
`InvalidArgument` naming the OpenAI field (`max_tokens`, not `max_new_tokens`). Formatting
turns worker chunks into OpenAI's JSON objects. The HTTP server (http.py) does the I/O.

Supported beyond OpenAI's fields (SGLang's extensions): top_k, min_p, repetition_penalty,
min_tokens, ignore_eos, stop_token_ids, skip_special_tokens, no_stop_trim, regex, ebnf,
json_schema; chat `response_format` json_object / json_schema become a JSON-schema
constraint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixmesh.client import convert
from radixmesh.errors import InvalidArgument
from radixmesh.tokenizer import TokenizerLike, validate_messages
from radixmesh.v1 import common_pb2

# OpenAI name -> SamplingParams name, for the fields that map one to one.
_PARAMS = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "seed": "seed",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
    "regex": "regex",
    "ebnf": "ebnf",
    "json_schema": "json_schema",
}
_OPENAI_NAME = {v: k for k, v in _PARAMS.items()}
_COMMON = {"model", "n", "stream", "stream_options", "user", "metadata", "store"}
COMPLETION_FIELDS = frozenset(_PARAMS) | _COMMON | {"prompt", "logprobs", "echo", "best_of"}
CHAT_FIELDS = (
    frozenset(_PARAMS)
    | _COMMON
    | {"messages", "logprobs", "top_logprobs", "max_completion_tokens", "response_format"}
)
MAX_TOP_LOGPROBS = 20
MAX_N = 16


@dataclass(frozen=True)
class OpenAIRequest:
    chat: bool
    model: str
    prompts: list[list[int]]  # token ids, one list per prompt
    params: list[common_pb2.SamplingParams]  # one per choice of a prompt (seeds differ)
    n: int
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # None: no logprobs; else this many alternatives per token
    # stream_options.continuous_usage_stats: every streamed chunk that brings tokens is
    # sent (even when they decode to no text) with the choice's running usage.
    continuous_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))


def openai_field(name: str) -> str:
    """The OpenAI name of a SamplingParams field (as a worker's error names it)."""
    base = name.removeprefix("sampling_params.")
    return _OPENAI_NAME.get(base, base)


def parse_request(
    body: Any, *, chat: bool, tokenizer: TokenizerLike, context_length: int
) -> OpenAIRequest:
    if not isinstance(body, dict):
        raise InvalidArgument("body", "the request body must be a JSON object")
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidArgument(unknown[0], f"unknown or unsupported field {unknown[0]!r}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidArgument("model", "give the model's name (GET /v1/models lists it)")
    if chat:
        prompts = [tokenizer.encode_chat(_messages(body.get("messages")))]
    else:
        prompts = _prompts(body.get("prompt"), tokenizer)
    n = _int(body, "n", 1, lo=1, hi=MAX_N)
    if not chat and body.get("best_of") not in (None, n):
        raise InvalidArgument("best_of", "only best_of == n is supported")
    if not chat and body.get("echo"):
        raise InvalidArgument("echo", "echo is not supported")
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise InvalidArgument("stream_options", "must be an object, and only with stream: true")
    include_usage = bool(stream and options and _bool(options, "include_usage", False))
    continuous = bool(stream and options and _bool(options, "continuous_usage_stats", False))
    top = _top_logprobs(body, chat)
    sampling = _sampling(body, chat, top)
    if chat and "max_new_tokens" not in sampling:
        # OpenAI's chat default: as many tokens as the context leaves.
        room = context_length - max(len(p) for p in prompts)
        sampling["max_new_tokens"] = max(room, 1)
    elif not chat:
        sampling.setdefault("max_new_tokens", 16)  # OpenAI's completions default
    per_choice = []
    for j in range(n):
        params = dict(sampling)
        if params.get("seed") is not None:
            params["seed"] = params["seed"] + j  # n choices of one seed must differ
        per_choice.append(_to_proto(params))
    return OpenAIRequest(
        chat, model, prompts, per_choice, n, stream, include_usage, top, continuous
    )


def _to_proto(params: dict[str, Any]) -> common_pb2.SamplingParams:
    try:
        return convert.make_params(params)
    except InvalidArgument as e:
        raise InvalidArgument(openai_field(e.field), e.message) from None


def _sampling(body: Mapping[str, Any], chat: bool, top: int | None) -> dict[str, Any]:
    params = {_PARAMS[k]: v for k, v in body.items() if k in _PARAMS and v is not None}
    if chat and body.get("max_completion_tokens") is not None:
        params["max_new_tokens"] = body["max_completion_tokens"]
    if isinstance(params.get("json_schema"), dict):
        params["json_schema"] = json.dumps(params["json_schema"])
    if chat:
        schema = _response_format(body.get("response_format"))
        if schema is not None:
            params["json_schema"] = schema
    if top is not None:
        params["return_logprob"] = True
        params["top_logprobs_num"] = top
    return params


def _response_format(fmt: Any) -> str | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidArgument("response_format", "must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise InvalidArgument(
                "response_format.json_schema", "needs an object with a `schema` object"
            )
        return json.dumps(spec["schema"])
    raise InvalidArgument(
        "response_format.type", f"must be text, json_object or json_schema, got {kind!r}"
    )


def _top_logprobs(body: Mapping[str, Any], chat: bool) -> int | None:
    if chat:
        if not _bool(body, "logprobs", False):
            if body.get("top_logprobs") is not None:
                raise InvalidArgument("top_logprobs", "needs logprobs: true")
            return None
        return _int(body, "top_logprobs", 0, lo=0, hi=MAX_TOP_LOGPROBS)
    if body.get("logprobs") is None:
        return None
    return _int(body, "logprobs", 0, lo=0, hi=MAX_TOP_LOGPROBS)


def _messages(raw: Any) -> list[dict[str, str]]:
    """OpenAI messages -> role/content strings (text parts joined; `developer` is system)."""
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument("messages", "must be a non-empty list of messages")
    out = []
    for i, msg in enumerate(raw):
        if not isinstance(msg, dict):
            raise InvalidArgument("messages", f"item {i} must be an object")
        content = msg.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise InvalidArgument("messages", f"item {i}: only text parts are supported")
                parts.append(str(part.get("text", "")))
            content = "".join(parts)
        role = msg.get("role")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return validate_messages(out)


def _prompts(raw: Any, tokenizer: TokenizerLike) -> list[list[int]]:
    """A string, a token list, or a list of either (a batch of prompts)."""
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(map(_is_token, raw))):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument("prompt", "give a string, a list of token ids, or a list of those")
    prompts = []
    for p in raw:
        if isinstance(p, str) and p:
            prompts.append(tokenizer.encode(p))
        elif isinstance(p, list) and p and all(_is_token(t) for t in p):
            prompts.append(list(p))
        else:
            raise InvalidArgument("prompt", "each prompt must be a non-empty string or id list")
    return prompts


def _is_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def _int(body: Mapping[str, Any], name: str, default: int, *, lo: int, hi: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgument(name, f"must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidArgument(name, f"must be true or false, got {value!r}")
    return value


# ---- replies --------------------------------------------------------------------------------


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def add(self, chunk: common_pb2.GenerateChunk, first_choice: bool) -> None:
        """Count a finished choice; the prompt once per prompt (its first choice)."""
        self.completion_tokens += chunk.completion_tokens
        if first_choice:
            self.prompt_tokens += chunk.prompt_tokens
            self.cached_tokens += chunk.cached_tokens

    @classmethod
    def of_chunk(cls, chunk: common_pb2.GenerateChunk) -> Usage:
        """One choice's usage so far (a chunk's counts are cumulative)."""
        return cls(chunk.prompt_tokens, chunk.completion_tokens, chunk.cached_tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


_FINISH = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}


def finish_reason(chunk: common_pb2.GenerateChunk) -> str | None:
    return _FINISH.get(chunk.finish.reason) if chunk.HasField("finish") else None


def logprobs_json(
    chunk: common_pb2.GenerateChunk, tokenizer: TokenizerLike, *, chat: bool, offset: int
) -> dict[str, Any]:
    """The chunk's token logprobs in the chat or the completions layout.

    `offset` is the completion's text length before this chunk (completions' text_offset).
    """

    def text(tid: int) -> str:
        return tokenizer.decode([tid], skip_special_tokens=False)

    def lp(e: common_pb2.TokenLogprob) -> float | None:
        return e.logprob if e.HasField("logprob") else None

    tops: Sequence[common_pb2.TopLogprobs] = chunk.top_logprobs
    if chat:
        content = []
        for i, e in enumerate(chunk.logprobs):
            alts = tops[i].tokens if i < len(tops) else []
            content.append(
                {
                    "token": text(e.token_id),
                    "logprob": lp(e),
                    "bytes": list(text(e.token_id).encode()),
                    "top_logprobs": [
                        {
                            "token": text(a.token_id),
                            "logprob": lp(a),
                            "bytes": list(text(a.token_id).encode()),
                        }
                        for a in alts
                    ],
                }
            )
        return {"content": content}
    tokens, offsets = [], []
    for e in chunk.logprobs:
        offsets.append(offset)
        tokens.append(text(e.token_id))
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [lp(e) for e in chunk.logprobs],
        "top_logprobs": [{text(a.token_id): lp(a) for a in t.tokens} for t in tops],
        "text_offset": offsets,
    }


def choice_json(
    req: OpenAIRequest, index: int, text: str, reason: str | None, logprobs: Any, *, delta: bool
) -> dict[str, Any]:
    """One choice: a message (chat), a delta (chat stream) or a text (completions)."""
    out: dict[str, Any] = {"index": index}
    if not req.chat:
        out["text"] = text
    elif delta:
        out["delta"] = {"content": text} if text else {}
    else:
        out["message"] = {"role": "assistant", "content": text}
    out["logprobs"] = logprobs
    out["finish_reason"] = reason
    return out


def envelope(req: OpenAIRequest, rid: str, *, chunk: bool) -> dict[str, Any]:
    if req.chat:
        kind = "chat.completion.chunk" if chunk else "chat.completion"
    else:
        kind = "text_completion"
    return {"id": rid, "object": kind, "created": req.created, "model": req.model}
