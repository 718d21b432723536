"""OpenAI Responses requests -> an OpenAI chat request -> the router's `Generation`.

As Anthropic's (anthropic/convert.py): the body is validated by its own models
(requests.py), rewritten as a chat completions body and parsed by `parse_chat`, so chat
templates, tool rendering, the call grammar, structured output and the sampling checks
are chat's own; errors name the Responses field (`max_tokens` -> `max_output_tokens`,
`response_format` -> `text.format`, `tools[0].function.parameters` ->
`tools[0].parameters`, any message -> `input`).

The mapping:
- `instructions` -> the first message, role system;
- the previous response's conversation (store.py), then `input`, item by item: a message
  -> a message of its role (its text parts joined by a blank line); `function_call`s ->
  `tool_calls` of the assistant message before them (a new one when there is none);
  `function_call_output` -> a tool message (`tool_call_id` = `call_id`);
- `text.format` json_schema / json_object -> chat's `response_format` (the grammar
  engine constrains the output); `tools`, `tool_choice`, `parallel_tool_calls` as chat's;
- `max_output_tokens` -> `max_tokens` (default: what the context leaves), `temperature`,
  `top_p` and radixmesh's `speculative` as they are;
- `top_logprobs`, or `include: ["message.output_text.logprobs"]` -> `logprobs: true` and
  `top_logprobs` (0 when only `include` asks): the output text's logprobs, which are the
  chat completion's for the same request. Either alone asks for them (`top_logprobs`
  alone is not dropped). Refused with tools that may be called: the text is parsed for
  calls as it comes, so its tokens are not the output text's one for one.

The input-token count (`POST /v1/responses/input_tokens`) renders the same prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from radixmesh.router.http.openai.convert import (
    Generation,
    parse_translated_chat,
    refuse,
    validate,
)
from radixmesh.router.http.openai.message import MessageStream
from radixmesh.router.http.openai.responses_api import requests as rq
from radixmesh.tokenizer import TokenizerLike

_RENAMES = (
    (re.compile(r"^max_tokens$"), "max_output_tokens"),
    (re.compile(r"^response_format\.json_schema$"), "text.format.schema"),
    (re.compile(r"^response_format.*"), "text.format"),
    (re.compile(r"^tools\[(\d+)\]\.function\."), r"tools[\1]."),
    # Chat messages are not the items one for one (instructions, history, merged calls).
    (re.compile(r"^messages.*"), "input"),
)


def field_name(chat_field: str) -> str:
    """The Responses name of a chat request's field."""
    for pattern, replacement in _RENAMES:
        if pattern.match(chat_field):
            return pattern.sub(replacement, chat_field)
    return chat_field


def parse_request(body: Any, *, strict: bool = False) -> rq.ResponsesRequest:
    """The body, validated (InvalidArgument naming its field). Its count of items was
    checked on the raw JSON (limits.py, `--max-messages`)."""
    req = validate(rq.ResponsesRequest, body, strict=strict)
    if req.background:
        refuse(
            "background",
            "background responses are not supported: send the request without it "
            "(`stream: true` gives the output as it comes)",
        )
    _refuse_unsupported(req)
    if req.prompt is not None:
        refuse("prompt", "prompt is not supported: send the items in `input`")
    if not req.input and req.previous_response_id is None:
        refuse("input", "give at least one input item")
    return req


def parse_count_request(body: Any, *, strict: bool = False) -> rq.InputTokensRequest:
    """An input-token count's body, validated."""
    req = validate(rq.InputTokensRequest, body, strict=strict)
    _refuse_unsupported(req)
    return req


def _refuse_unsupported(req: rq.InputTokensRequest) -> None:
    if req.conversation is not None:
        refuse("conversation", "conversation is not supported: send the items in `input`")


def generation_of(
    req: rq.ResponsesRequest,
    history: Sequence[rq.Item],
    *,
    tokenizer: TokenizerLike,
    context_length: int,
    tool_call_parser: str = "auto",
) -> Generation:
    """The request, after the previous response's items (`history`), as a Generation."""
    chat = _chat_body(req, history)
    chat["stream"] = bool(req.stream)
    if req.max_output_tokens is not None:
        chat["max_tokens"] = req.max_output_tokens
    for name in ("temperature", "top_p", "speculative"):
        if getattr(req, name) is not None:
            chat[name] = getattr(req, name)
    if req.logprobs:
        chat |= {"logprobs": True, "top_logprobs": req.top_logprobs or 0}
    gen = parse_translated_chat(
        chat,
        tokenizer=tokenizer,
        context_length=context_length,
        tool_call_parser=tool_call_parser,
        field_name=field_name,
    )
    if req.logprobs and MessageStream.of(gen) is not None:
        refuse(
            "top_logprobs" if req.top_logprobs is not None else "include",
            "logprobs are not supported with tools the model may call (tool_choice auto, "
            "required or a function): its text is parsed for calls; use tool_choice none",
        )
    return gen


def count_input_tokens(
    req: rq.InputTokensRequest,
    history: Sequence[rq.Item],
    *,
    tokenizer: TokenizerLike,
    context_length: int,
    tool_call_parser: str = "auto",
) -> int:
    """The prompt's tokens of the request, after the previous response's items."""
    chat = _chat_body(req, history) | {"max_tokens": 0}
    return len(
        parse_translated_chat(
            chat,
            tokenizer=tokenizer,
            context_length=context_length,
            tool_call_parser=tool_call_parser,
            field_name=field_name,
        ).prompts[0]
    )


def _chat_body(req: rq.InputTokensRequest, history: Sequence[rq.Item]) -> dict[str, Any]:
    """The chat body of the prompt's fields."""
    chat: dict[str, Any] = {"model": req.model or "", "messages": chat_messages(req, history)}
    if req.parallel_tool_calls is not None:
        chat["parallel_tool_calls"] = req.parallel_tool_calls
    if isinstance(req.tool_choice, rq.NamedFunction):
        chat["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None:
        chat["tool_choice"] = req.tool_choice
    if req.tools:
        chat["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in req.tools
        ]
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type != "text":
        chat["response_format"] = _response_format(fmt)
    return chat


def _response_format(fmt: rq.TextFormat) -> dict[str, Any]:
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        refuse("text.format.schema", "a json_schema format needs its `schema` object")
    schema = {"name": fmt.name or "output", "schema": fmt.schema_}
    return {"type": "json_schema", "json_schema": schema}


def chat_messages(req: rq.InputTokensRequest, history: Sequence[rq.Item]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    items: list[tuple[str | None, rq.Item]] = [(None, item) for item in history]
    items += [(f"input[{i}]", item) for i, item in enumerate(req.input)]
    for where, item in items:
        if isinstance(item, rq.MessageItem):
            messages.append({"role": item.role, "content": _text(where, "content", item.content)})
        elif isinstance(item, rq.FunctionCallItem):
            _add_call(messages, where, item)
        elif isinstance(item, rq.FunctionCallOutputItem):
            text = _text(where, "output", item.output)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
    if not messages:
        refuse("input", "give at least one message")
    return messages


def _text(where: str | None, name: str, parts: list[Any]) -> str:
    texts = []
    for j, part in enumerate(parts):
        if isinstance(part, rq.Unreadable):
            refuse(
                f"{where}.{name}[{j}]",
                f"{part.type} is not supported: the served model reads text only",
            )
        texts.append(part.text if isinstance(part, rq.InputText) else part.refusal)
    return "\n\n".join(texts)


def _add_call(messages: list[dict[str, Any]], where: str | None, item: rq.FunctionCallItem) -> None:
    try:
        json.loads(item.arguments)
    except json.JSONDecodeError as e:
        refuse(f"{where}.arguments", f"not valid JSON: {e}")
    call = {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }
    if messages and messages[-1]["role"] == "assistant":
        messages[-1].setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
