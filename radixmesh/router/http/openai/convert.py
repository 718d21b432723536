"""OpenAI requests -> the router's terms: token ids and validated `SamplingParams`.

The one place where OpenAI's names meet radixmesh's: a request body is validated by its
pydantic model (requests.py), its fields are mapped to sampling parameters and checked by
the shared schema (`SamplingParams`), and errors name the field the client sent
(`max_tokens`, not `max_new_tokens`; `messages[2].tool_call_id`). Unknown top-level fields
are refused with `strict` (the router's default: `--strict-openai`, as OpenAI's API
refuses them), else logged once per name and dropped. The output constraint, in any of
its dialects, is constraints.py's.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from radixmesh.client import convert
from radixmesh.errors import InvalidArgument
from radixmesh.redact import label
from radixmesh.router.http.openai import constraints, tools
from radixmesh.router.http.openai import requests as rq
from radixmesh.router.limits import check_prompt_fits, encode_within
from radixmesh.tokenizer import TokenizerLike
from radixmesh.v1 import common_pb2

logger = logging.getLogger(__name__)

PARAMS = rq.PARAMS  # OpenAI name -> SamplingParams name
_OPENAI_NAME = {v: k for k, v in PARAMS.items()}
_COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_TYPE_NAMES = {"str", "int", "float", "bool", "bytes"}  # union members in pydantic locations
_LOGGED_LIMIT = 256  # distinct unknown field names logged (a bound on the set)
_logged: set[str] = set()

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Generation:
    """A completions or chat request, parsed: what the router generates and how to reply."""

    chat: bool
    model: str
    prompts: list[list[int]]  # token ids, one list per prompt
    params: list[common_pb2.SamplingParams]  # one per choice of a prompt (seeds differ)
    n: int
    stream: bool
    include_usage: bool
    continuous_usage: bool  # usage on every streamed chunk
    top_logprobs: int | None  # None: no logprobs; else this many alternatives per token
    # Completions' echo: each prompt's text, which its choices' text starts with.
    echo: list[str] | None = None
    tool_plan: tools.ToolPlan | None = None  # chat with tools: how calls are made and parsed
    # separate_reasoning: the prompt's last characters (a template that opens `<think>`
    # starts the reply in reasoning); None: no reasoning_content.
    reasoning_tail: str | None = None
    # SamplingParams field -> the OpenAI field it came from, for the worker's errors.
    fields: Mapping[str, str] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    def openai_field(self, name: str) -> str:
        base = name.removeprefix("sampling_params.")
        return self.fields.get(base) or openai_field(base)


def openai_field(name: str) -> str:
    """The OpenAI name of a SamplingParams field (as a worker's error names it)."""
    base = name.removeprefix("sampling_params.")
    return _OPENAI_NAME.get(base, base)


# ---- validation ---------------------------------------------------------------------------


def validate(model: type[M], body: Any, *, strict: bool) -> M:
    """`body` as `model`; InvalidArgument naming the first bad or (strict) unknown field."""
    if not isinstance(body, dict):
        raise InvalidArgument("body", "the request body must be a JSON object")
    try:
        parsed = model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        raise InvalidArgument(error_param(first["loc"]), first["msg"]) from None
    unknown = sorted(parsed.model_extra or ())
    if unknown and strict:
        raise InvalidArgument(unknown[0], f"unknown or unsupported field {unknown[0]!r}")
    for name in unknown:
        if name not in _logged and len(_logged) < _LOGGED_LIMIT:
            _logged.add(name)
            # The name is the client's text: cut and escaped, and masked as any log line.
            logger.warning("ignoring the unknown request field '%s' (reported once)", label(name))
    return parsed


def error_param(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the field path a client knows: `messages[1].content`.
    Union members and tags (`str`, class names, `role user`) are not fields: left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier() and not part[0].isupper() and part not in _TYPE_NAMES:
            out += f".{part}" if out else part
    return out or "body"


def refuse(name: str, why: str) -> None:
    raise InvalidArgument(name, why)


# ---- tokenize -----------------------------------------------------------------------------


def parse_tokenize(
    body: Any, *, tokenizer: TokenizerLike, strict: bool = False
) -> rq.TokenizeRequest:
    """Validated; exactly one of prompt and messages."""
    req = validate(rq.TokenizeRequest, body, strict=strict)
    if (req.prompt is None) == (req.messages is None):
        refuse("prompt", "give exactly one of prompt and messages")
    return req


def tokenize(req: rq.TokenizeRequest, tok: TokenizerLike) -> list[int]:
    if req.messages is not None:
        return chat_ids(req, tok, req.add_generation_prompt is not False)
    assert req.prompt is not None
    return tok.encode(req.prompt, add_special_tokens=bool(req.add_special_tokens))


# ---- completions and chat -----------------------------------------------------------------


def parse_completion(
    body: Any, *, tokenizer: TokenizerLike, context_length: int, strict: bool = False
) -> Generation:
    req = validate(rq.CompletionRequest, body, strict=strict)
    n = req.n or 1
    if req.best_of not in (None, n):
        refuse("best_of", "only best_of == n is supported")
    if req.suffix:
        refuse("suffix", "suffix (insertion) is not supported")
    top = req.logprobs
    sampling = _sampling(req, top)
    fields = _renamed(req)
    _constrain(sampling, fields, constraints.requested(req))
    sampling.setdefault("max_new_tokens", _COMPLETIONS_MAX_TOKENS)
    prompts, texts = _prompts(req.prompt, tokenizer, context_length, sampling["max_new_tokens"])
    if req.echo and top is not None:
        if req.stream:
            # Prompt logprobs come with a request's last chunk, after its first text.
            refuse("echo", "echo with logprobs is not supported when streaming")
        sampling["logprob_start_len"] = 0  # the prompt's logprobs, from its first token
    gen = _generation(req, False, prompts, sampling, top, fields)
    return dataclasses.replace(gen, echo=texts) if req.echo else gen


@dataclass(frozen=True)
class ChatOptions:
    """The router's settings for chat requests."""

    tool_call_parser: str = "auto"  # a syntax of tool_parsers.PARSERS, or auto
    separate_reasoning: bool = False  # the default of the request's separate_reasoning


def parse_translated_chat(
    chat: dict[str, Any],
    *,
    tokenizer: TokenizerLike,
    context_length: int,
    tool_call_parser: str,
    field_name: Callable[[str], str],
) -> Generation:
    """`parse_chat` of a chat body that another front door built from its own request
    (Anthropic's Messages, the Responses API): a bad field's error names it as that
    door's clients spell it (`field_name`); reasoning is not separated (each door shapes
    its own reply)."""
    try:
        return parse_chat(
            chat,
            tokenizer=tokenizer,
            context_length=context_length,
            options=ChatOptions(tool_call_parser=tool_call_parser, separate_reasoning=False),
        )
    except InvalidArgument as e:
        raise InvalidArgument(field_name(e.field), e.message) from None


def parse_chat(
    body: Any,
    *,
    tokenizer: TokenizerLike,
    context_length: int,
    strict: bool = False,
    options: ChatOptions = ChatOptions(),
) -> Generation:
    req = validate(rq.ChatCompletionRequest, body, strict=strict)
    _refuse_unsupported_chat(req)
    if req.top_logprobs is not None and not req.logprobs:
        refuse("top_logprobs", "needs logprobs: true")
    top = (req.top_logprobs or 0) if req.logprobs else None
    sampling = _sampling(req, top)
    fields = _renamed(req)
    constraint = constraints.requested(req)
    tools.check_tools(req)
    syntax = tools.syntax_of(tokenizer, options.tool_call_parser)
    plan = tools.plan(req, syntax)
    if plan is not None and plan.structural_tag is not None:
        if constraint is not None:
            refuse(
                "tool_choice",
                f"a required tool call cannot be combined with another constraint "
                f"({constraint.field})",
            )
        constraint = constraints.Constraint("structural_tag", plan.structural_tag, "tools")
    _constrain(sampling, fields, constraint)
    if plan is not None and plan.parser is not None and syntax == "mistral":
        sampling.setdefault("skip_special_tokens", False)  # [TOOL_CALLS] is a special token
    prompts = [chat_ids(req, tokenizer, context_length=context_length)]
    check_prompt_fits(
        "messages", len(prompts[0]), context_length, sampling.get("max_new_tokens", 1)
    )
    if "max_new_tokens" not in sampling:
        # OpenAI's chat default: as many tokens as the context leaves.
        sampling["max_new_tokens"] = max(context_length - len(prompts[0]), 1)
    gen = _generation(req, True, prompts, sampling, top, fields)
    separate = (
        options.separate_reasoning if req.separate_reasoning is None else req.separate_reasoning
    )
    tail = tokenizer.decode(prompts[0][-8:], skip_special_tokens=False)
    return dataclasses.replace(gen, tool_plan=plan, reasoning_tail=tail if separate else None)


def _refuse_unsupported_chat(req: rq.ChatCompletionRequest) -> None:
    if req.audio is not None or "audio" in (req.modalities or ()):
        refuse("audio" if req.audio is not None else "modalities", "audio output is not supported")
    for name in ("prediction", "web_search_options", "moderation"):
        if getattr(req, name) is not None:
            refuse(name, f"{name} is not supported")
    if req.verbosity not in (None, "medium"):
        refuse("verbosity", 'only "medium" (the default) is supported: the model sets its length')
    for name in ("functions", "function_call"):
        if getattr(req, name) is not None:
            refuse(name, f"the deprecated {name} is not supported: use tools / tool_choice")


def _generation(
    req: rq.Sampling,
    chat: bool,
    prompts: list[list[int]],
    sampling: dict[str, Any],
    top: int | None,
    fields: dict[str, str],
) -> Generation:
    n = req.n or 1
    stream = bool(req.stream)
    options = req.stream_options
    if options is not None and not stream:
        refuse("stream_options", "only with stream: true")
    per_choice = []
    for j in range(n):
        params = dict(sampling)
        if params.get("seed") is not None:
            params["seed"] = params["seed"] + j  # n choices of one seed must differ
        per_choice.append(_to_proto(params, fields))
    return Generation(
        chat=chat,
        model=req.model,
        prompts=prompts,
        params=per_choice,
        n=n,
        stream=stream,
        include_usage=bool(options and options.include_usage),
        continuous_usage=bool(options and options.continuous_usage_stats),
        top_logprobs=top,
        fields=fields,
    )


def _to_proto(params: dict[str, Any], fields: Mapping[str, str]) -> common_pb2.SamplingParams:
    try:
        return convert.make_params(params)
    except InvalidArgument as e:
        name = fields.get(e.field) or openai_field(e.field)
        raise InvalidArgument(name, e.message) from None


def _sampling(req: rq.Sampling, top: int | None) -> dict[str, Any]:
    """PARAMS' fields as SamplingParams names; the constraint is `_constrain`'s."""
    include = set(PARAMS) - set(constraints.SGLANG_FIELDS)
    values = req.model_dump(include=include, exclude_none=True)
    params = {PARAMS[k]: v for k, v in values.items()}
    if req.max_completion_tokens is not None:
        params["max_new_tokens"] = req.max_completion_tokens
    if top is not None:
        params["return_logprob"] = True
        params["top_logprobs_num"] = top
    return params


def _renamed(req: rq.Sampling) -> dict[str, str]:
    """SamplingParams fields that came from another OpenAI field than PARAMS says."""
    return (
        {"max_new_tokens": "max_completion_tokens"} if req.max_completion_tokens is not None else {}
    )


def _constrain(
    sampling: dict[str, Any], fields: dict[str, str], constraint: constraints.Constraint | None
) -> None:
    """Set `constraint` in `sampling`, remembering the request field it came from."""
    if constraint is not None:
        sampling[constraint.kind] = constraint.value
        fields[constraint.kind] = constraint.field


def chat_ids(
    req: rq.ChatCompletionRequest | rq.TokenizeRequest,
    tok: TokenizerLike,
    add_generation_prompt: bool = True,
    context_length: int | None = None,
) -> list[int]:
    """The prompt of a chat: the messages (and tools) through the model's chat template;
    with `context_length`, a rendered chat far past it is refused from its head
    (limits.encode_within)."""
    assert req.messages is not None
    if req.tools or tools.has_tool_messages(req.messages):
        return tools.prompt_ids(req, tok, add_generation_prompt)
    extra = req.chat_template_kwargs
    if context_length is None:
        return tok.encode_chat(_plain_messages(req.messages), add_generation_prompt, extra)
    text = tok.apply_chat_template(_plain_messages(req.messages), add_generation_prompt, extra)
    return encode_within(tok.encode, text, context_length, "messages")


def _plain_messages(messages: list[rq.Message]) -> list[dict[str, str]]:
    """Messages as the chat template takes them: role and text (parts joined)."""
    out = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        out.append({"role": role, "content": rq.text_of(m.content)})
    return out


def _prompts(
    raw: str | list[int] | list[rq.PromptItem],
    tok: TokenizerLike,
    context_length: int,
    max_new_tokens: int,
) -> tuple[list[list[int]], list[str]]:
    """A string, a token list, or a list of either (a batch of prompts): token ids and
    text of each (token ids are decoded), each within the context."""
    items: list[rq.PromptItem]
    if isinstance(raw, str) or (raw and all(isinstance(t, int) for t in raw)):
        items = [raw]  # type: ignore[list-item]
    else:
        items = list(raw)  # type: ignore[arg-type]
    if not items:
        refuse("prompt", "give a string, a list of token ids, or a list of those")
    prompts, texts = [], []
    for i, p in enumerate(items):
        name = "prompt" if len(items) == 1 else f"prompt[{i}]"
        if isinstance(p, str):
            if not p:
                refuse(name, "the prompt is empty")
            prompts.append(encode_within(tok.encode, p, context_length, name))
            texts.append(p)
        else:
            prompts.append(token_ids(p, tok, name))
        check_prompt_fits(name, len(prompts[-1]), context_length, max_new_tokens)
        if not isinstance(p, str):  # decoded once known to fit
            texts.append(tok.decode(p, skip_special_tokens=False))
    return prompts, texts


def token_ids(ids: list[int], tok: TokenizerLike, name: str) -> list[int]:
    if not ids:
        refuse(name, "the token id list is empty")
    if any(t < 0 or t >= tok.vocab_size for t in ids):
        refuse(name, f"token ids must be in [0, {tok.vocab_size})")
    return list(ids)
