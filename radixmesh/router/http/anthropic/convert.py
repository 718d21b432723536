"""Anthropic Messages requests -> an OpenAI chat request -> the router's `Generation`.

The body is validated by its own models (requests.py), then rewritten as a chat
completions body and parsed by `parse_chat` (openai/convert.py): one chat template, one
tool rendering and call grammar, one set of sampling checks for every API, so a fix to
any of them serves both. Errors name the field in Anthropic's spelling (`field_name`
maps chat names back: `stop` -> `stop_sequences`, `tools[0].function.parameters` ->
`tools[0].input_schema`).

The mapping:
- `system` (a string or text blocks) -> the first message, role system;
- a user message's text blocks -> user messages, its `tool_result` blocks -> tool
  messages (`tool_call_id` = `tool_use_id`; an `is_error` result reads "Error: ..."),
  in block order; the text blocks of one run are joined by a blank line;
- an assistant message's text -> content, its `tool_use` blocks -> `tool_calls` (the
  input object as JSON arguments);
- a last assistant message is a prefill: its text is appended to the prompt after the
  generation prompt, and the reply holds what follows (Anthropic's behaviour);
- `tool_choice` auto / any / tool / none -> auto / required / the named function / none;
  `disable_parallel_tool_use` -> `parallel_tool_calls: false`;
- `stop_sequences` -> `stop`; `output_config.format` (a JSON schema) -> chat's
  `response_format` (the grammar engine holds the output to it); `max_tokens`,
  `temperature`, `top_p`, `top_k` as they are (Anthropic's newer clients no longer
  declare the sampling fields; they still reach the router as extra body fields), and
  radixmesh's `speculative` (false: the request never drafts tokens).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from radixmesh.router.http.anthropic import requests as rq
from radixmesh.router.http.openai.convert import (
    Generation,
    parse_translated_chat,
    refuse,
    validate,
)
from radixmesh.router.limits import check_prompt_fits
from radixmesh.tokenizer import TokenizerLike

# Chat field -> Anthropic field, for errors that parse_chat or a worker raise.
_RENAMES = (
    (re.compile(r"^tools\[(\d+)\]\.function\.parameters"), r"tools[\1].input_schema"),
    (re.compile(r"^tools\[(\d+)\]\.function\.name"), r"tools[\1].name"),
    (re.compile(r"^stop$"), "stop_sequences"),
    (re.compile(r"^response_format\.json_schema$"), "output_config.format.schema"),
    (re.compile(r"^response_format.*"), "output_config.format"),
    (re.compile(r"^parallel_tool_calls$"), "tool_choice.disable_parallel_tool_use"),
    # Chat messages are not Anthropic's one for one (system first, blocks split).
    (re.compile(r"^messages\[.*"), "messages"),
)


def field_name(chat_field: str) -> str:
    """The Anthropic name of a chat request's field."""
    for pattern, replacement in _RENAMES:
        if pattern.match(chat_field):
            return pattern.sub(replacement, chat_field)
    return chat_field


def parse_messages(
    body: Any,
    *,
    tokenizer: TokenizerLike,
    context_length: int,
    strict: bool = False,
    tool_call_parser: str = "auto",
) -> Generation:
    """A messages request, validated and tokenized (InvalidArgument naming its field)."""
    req = validate(rq.MessagesRequest, body, strict=strict)
    for name in ("mcp_servers", "container"):
        if getattr(req, name) is not None:
            refuse(name, f"{name} is not supported: radixmesh runs no server-side tools")
    chat, prefill = chat_body(req)
    chat |= {"max_tokens": req.max_tokens, "stream": bool(req.stream)}
    for name in ("temperature", "top_p", "top_k", "speculative"):
        if getattr(req, name) is not None:
            chat[name] = getattr(req, name)
    if req.stop_sequences is not None:
        chat["stop"] = req.stop_sequences
    fmt = req.output_config.format if req.output_config is not None else None
    if fmt is not None:
        chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt.schema_}}
    gen = parse_translated_chat(
        chat,
        tokenizer=tokenizer,
        context_length=context_length,
        tool_call_parser=tool_call_parser,
        field_name=field_name,
    )
    if prefill:
        ids = gen.prompts[0] + tokenizer.encode(prefill)
        check_prompt_fits("messages", len(ids), context_length, req.max_tokens)
        gen = dataclasses.replace(gen, prompts=[ids])
    return gen


def count_tokens(
    body: Any, *, tokenizer: TokenizerLike, context_length: int, strict: bool = False
) -> int:
    """The prompt's tokens of a `count_tokens` request (its prefill included)."""
    req = validate(rq.CountTokensRequest, body, strict=strict)
    chat, prefill = chat_body(req)
    gen = parse_translated_chat(
        chat | {"max_tokens": 0},
        tokenizer=tokenizer,
        context_length=context_length,
        tool_call_parser="auto",
        field_name=field_name,
    )
    return len(gen.prompts[0]) + (len(tokenizer.encode(prefill)) if prefill else 0)


def chat_body(req: rq.MessagesRequest | rq.CountTokensRequest) -> tuple[dict[str, Any], str]:
    """The chat body of the request's prompt fields, and the prefill ("" for none)."""
    messages: list[dict[str, Any]] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else _joined(req.system)
        messages.append({"role": "system", "content": system})
    history, prefill = req.messages, ""
    if history[-1].role == "assistant":
        prefill = _prefill(len(history) - 1, history[-1])
        history = history[:-1]
    for i, m in enumerate(history):
        messages += _user(i, m) if m.role == "user" else [_assistant(i, m)]
    if not messages:
        refuse("messages", "a prefill (a last assistant message) needs a user message before it")
    chat: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.tools:
        chat["tools"] = [_tool(t) for t in req.tools]
    if req.tool_choice is not None:
        chat |= _tool_choice(req.tool_choice, bool(req.tools))
    return chat, prefill


def _joined(blocks: list[rq.TextBlock]) -> str:
    return "\n\n".join(b.text for b in blocks)


def _refuse_unreadable(where: str, block: Any) -> None:
    if isinstance(block, rq.ImageBlock | rq.DocumentBlock):
        refuse(where, f"{block.type} blocks are not supported: the served model reads text only")


def _user(i: int, m: rq.Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": "\n\n".join(texts)})
            texts.clear()

    for j, block in enumerate(m.content):
        where = f"messages[{i}].content[{j}]"
        _refuse_unreadable(where, block)
        if isinstance(block, rq.TextBlock):
            texts.append(block.text)
        elif isinstance(block, rq.ToolResultBlock):
            flush()
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id,
                    "content": _result(where, block),
                }
            )
        elif isinstance(block, rq.ToolUseBlock):
            refuse(f"{where}.type", "tool_use blocks belong in assistant messages")
    flush()
    if not out:  # only thinking blocks, or none: an empty turn keeps the roles alternating
        out.append({"role": "user", "content": ""})
    return out


def _result(where: str, block: rq.ToolResultBlock) -> str:
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        for k, part in enumerate(content):
            _refuse_unreadable(f"{where}.content[{k}]", part)
        text = _joined([p for p in content if isinstance(p, rq.TextBlock)])
    return f"Error: {text}" if block.is_error else text


def _assistant(i: int, m: rq.Message) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(m.content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(block, rq.TextBlock):
            texts.append(block.text)
        elif isinstance(block, rq.ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": arguments},
                }
            )
        elif not isinstance(block, rq.ThinkingBlock):
            refuse(f"{where}.type", f"{block.type} blocks belong in user messages")
    message: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _prefill(i: int, m: rq.Message) -> str:
    texts = []
    for j, block in enumerate(m.content):
        if isinstance(block, rq.TextBlock):
            texts.append(block.text)
        elif not isinstance(block, rq.ThinkingBlock):
            refuse(
                f"messages[{i}].content[{j}].type",
                "a last assistant message is a prefill: it may hold text blocks only",
            )
    return "".join(texts)


def _tool(tool: rq.Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _tool_choice(choice: rq.ToolChoice, has_tools: bool) -> dict[str, Any]:
    if choice.type in ("any", "tool") and not has_tools:
        refuse("tool_choice", f"{choice.type} needs at least one tool in `tools`")
    out: dict[str, Any] = {}
    if choice.type == "tool":
        if not choice.name:
            refuse("tool_choice.name", "tool_choice of type tool names the tool")
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use and has_tools:
        out["parallel_tool_calls"] = False
    return out
