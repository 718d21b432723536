"""Tool calling: check the tools, render the conversation, build the call grammar.

Rendering: a chat template with a tool section (it mentions `tools`) gets the tools and
the tool messages as Hugging Face templates take them (`tools=`, assistant `tool_calls`
with arguments as objects, `tool` messages with `tool_call_id` and the function's
`name`). A template without one gets the documented fallback in the `hermes` syntax:
the tools and how to call them in the system message, past calls as
`<tool_call>{...}</tool_call>` blocks in the assistant's text, tool results as user
messages wrapped in `<tool_response>...</tool_response>`.

The syntax (tool_parsers.PARSERS) follows the template: `<tool_call>` -> hermes,
`[TOOL_CALLS]` -> mistral, `<|python_tag|>` -> llama3; the router's `tool_call_parser`
overrides it. With `tool_choice` "required" or a named function, the call is generated
under a structural tag (xgrammar) in that syntax: fixed text around each function's
parameter schema, so the arguments always parse and validate. With "auto" the reply is
parsed; with "none" it is content.

The grammar ends after the calls: the reply can hold nothing but them, and no more than
it may make. A named function, or `parallel_tool_calls: false`, allows one call (OpenAI's
named choice is one call of that function); otherwise at most `PARALLEL_CALLS_LIMIT`.
Without that end a small model repeats its call until `max_tokens` cuts one in half.
Identical calls within the limit are collapsed by the parser (tool_parsers.py): a
grammar cannot tell a call from its copy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.openai import requests as rq
from radixmesh.router.http.openai.tool_parsers import PARSERS, ToolCallParser
from radixmesh.tokenizer import Message, TokenizerLike, ToolMessage

_MARKERS = (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3"))
# In each syntax: the text before a call's arguments (with the function's name), after
# them, between calls; and around the whole list.
_CALL_TEXT = {
    "hermes": ('<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>", "\n"),
    "llama3": ('{{"name": "{name}", "parameters": ', "}", ";"),
    "mistral": ('{{"name": "{name}", "arguments": ', "}", ", "),
}
_AROUND = {"mistral": ("[TOOL_CALLS][", "]")}
# The calls one reply may make when parallel calls are allowed. OpenAI states no limit;
# a bound is what ends the grammar, and a model that wants more calls makes them in its
# next turn. 8 covers the fan-outs agents ask for (read these files, these cities) and
# bounds what a model looping on its own call spends.
PARALLEL_CALLS_LIMIT = 8
FALLBACK_PROMPT = (
    "You can call functions to answer. They are described below in JSON Schema, one per "
    "line, between <tools> and </tools>.\n<tools>\n{tools}\n</tools>\nTo call functions, "
    "reply with one block per call and nothing else:\n<tool_call>\n"
    '{{"name": "<function name>", "arguments": <the arguments as a JSON object>}}\n'
    "</tool_call>\nTheir results come back between <tool_response> and </tool_response>."
)


@dataclass(frozen=True)
class ToolPlan:
    """How a chat request with tools is served."""

    parser: ToolCallParser | None  # None: tool_choice "none", the reply is content
    structural_tag: str | None  # the call grammar ("required" or a named function)


def syntax_of(tok: TokenizerLike, configured: str = "auto") -> str:
    """The tool-call syntax of a model: `configured`, else what its template uses."""
    if configured != "auto":
        return configured
    template = getattr(getattr(tok, "hf_tokenizer", None), "chat_template", None)
    if tok.supports_tools and isinstance(template, str):
        for marker, syntax in _MARKERS:
            if marker in template:
                return syntax
    return "hermes"


def check_tools(req: rq.ChatCompletionRequest) -> None:
    """Schemas that are JSON Schema, unique names, a tool_choice that names one of them."""
    tools = req.tools or []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        fn = tool.function
        if fn.name in names:
            raise InvalidArgument(f"tools[{i}].function.name", f"{fn.name!r} is defined twice")
        names.add(fn.name)
        if fn.parameters is not None:
            validator = jsonschema.validators.validator_for(fn.parameters)
            try:
                validator.check_schema(fn.parameters)
            except jsonschema.SchemaError as e:
                where = "".join(f"[{p!r}]" for p in e.path)
                raise InvalidArgument(
                    f"tools[{i}].function.parameters",
                    f"not a valid JSON Schema{where}: {e.message}",
                ) from None
    choice = req.tool_choice
    if isinstance(choice, rq.NamedToolChoice) and choice.function.name not in names:
        known = ", ".join(sorted(names)) or "none"
        raise InvalidArgument(
            "tool_choice", f"no tool named {choice.function.name!r} (tools: {known})"
        )
    if choice == "required" and not tools:
        raise InvalidArgument("tool_choice", "required needs at least one tool")


def plan(req: rq.ChatCompletionRequest, syntax: str) -> ToolPlan | None:
    """None for a request without tools."""
    if not req.tools or req.tool_choice == "none":
        return ToolPlan(None, None) if req.tools else None
    parser = PARSERS[syntax]()
    choice = req.tool_choice
    if choice is None or choice == "auto":
        return ToolPlan(parser, None)
    functions = [t.function for t in req.tools]
    if isinstance(choice, rq.NamedToolChoice):
        functions = [f for f in functions if f.name == choice.function.name]
    single = isinstance(choice, rq.NamedToolChoice) or req.parallel_tool_calls is False
    max_calls = 1 if single else PARALLEL_CALLS_LIMIT
    return ToolPlan(parser, structural_tag(functions, syntax, max_calls))


def structural_tag(functions: list[rq.FunctionDefinition], syntax: str, max_calls: int) -> str:
    """xgrammar's structural tag: 1 to `max_calls` calls in a row, nothing else (the
    grammar, and so the reply, ends after the last one)."""
    if max_calls < 1:
        raise ValueError(f"max_calls must be at least 1, got {max_calls}")
    before, after, between = _CALL_TEXT[syntax]
    tags = [
        {
            "type": "tag",
            "begin": before.format(name=f.name),
            "content": {
                "type": "json_schema",
                "json_schema": f.parameters if f.parameters is not None else {"type": "object"},
                # JSON's free whitespace, bounded: a small model may not stop emitting it.
                "max_whitespace_cnt": 1,
            },
            "end": after,
        }
        for f in functions
    ]
    call: dict[str, Any] = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
    calls = call
    if max_calls > 1:
        more = {"type": "sequence", "elements": [{"type": "const_string", "value": between}, call]}
        calls = {
            "type": "sequence",
            "elements": [call, {"type": "repeat", "min": 0, "max": max_calls - 1, "content": more}],
        }
    if syntax in _AROUND:
        head, tail = _AROUND[syntax]
        calls = {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": head},
                calls,
                {"type": "const_string", "value": tail},
            ],
        }
    return json.dumps({"type": "structural_tag", "format": calls})


# ---- rendering ----------------------------------------------------------------------------


def prompt_ids(
    req: rq.ChatCompletionRequest | rq.TokenizeRequest,
    tok: TokenizerLike,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The prompt of a chat with tools (or tool messages) in its history."""
    assert req.messages is not None
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    extra = req.chat_template_kwargs
    if tok.supports_tools:
        return tok.encode_tool_chat(
            template_messages(req.messages), tools, add_generation_prompt, extra
        )
    return tok.encode_chat(fallback_messages(req.messages, tools), add_generation_prompt, extra)


def has_tool_messages(messages: list[rq.Message]) -> bool:
    return any(
        m.role == "tool" or (isinstance(m, rq.AssistantMessage) and m.tool_calls) for m in messages
    )


def _arguments(i: int, j: int, call: rq.ToolCall) -> Any:
    try:
        return json.loads(call.function.arguments)
    except json.JSONDecodeError as e:
        raise InvalidArgument(
            f"messages[{i}].tool_calls[{j}].function.arguments", f"not valid JSON: {e}"
        ) from None


def template_messages(messages: list[rq.Message]) -> list[ToolMessage]:
    """Messages as Hugging Face chat templates with a tool section take them."""
    out: list[ToolMessage] = []
    names: dict[str, str] = {}  # tool_call_id -> function name
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        msg: ToolMessage = {"role": role, "content": rq.text_of(m.content)}
        if isinstance(m, rq.AssistantMessage) and m.tool_calls:
            msg["tool_calls"] = []
            for j, call in enumerate(m.tool_calls):
                names[call.id] = call.function.name
                fn = {"name": call.function.name, "arguments": _arguments(i, j, call)}
                msg["tool_calls"].append({"id": call.id, "type": "function", "function": fn})
        if isinstance(m, rq.ToolMessage):
            msg["tool_call_id"] = m.tool_call_id
            if m.tool_call_id in names:
                msg["name"] = names[m.tool_call_id]
        out.append(msg)
    return out


def fallback_messages(messages: list[rq.Message], tools: list[dict[str, Any]]) -> list[Message]:
    """Plain role / content messages carrying the tools and calls as text (hermes syntax)."""
    out: list[Message] = []
    for i, m in enumerate(messages):
        text = rq.text_of(m.content)
        if isinstance(m, rq.AssistantMessage) and m.tool_calls:
            blocks = [
                "<tool_call>\n"
                + json.dumps({"name": c.function.name, "arguments": _arguments(i, j, c)})
                + "\n</tool_call>"
                for j, c in enumerate(m.tool_calls)
            ]
            text = "\n".join([text, *blocks] if text else blocks)
        if m.role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"})
        else:
            out.append({"role": "system" if m.role == "developer" else m.role, "content": text})
    if tools:
        described = FALLBACK_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + described}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out
