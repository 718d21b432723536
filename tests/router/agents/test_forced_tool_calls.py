"""Forced tool calls through the `openai` and `anthropic` clients on the bundled smollm2:
`tool_choice` required (parallel calls on and off), a named tool, Anthropic's `any`, on
chat completions, Messages and Responses, streamed and not; and `max_tokens` cutting a call.

Each tool's one argument is an enum of one city, so the call grammar fixes every
character of a call: a call is one of the two in `CALLS` whatever the model prefers.
What the model still chooses (which tool, whether another call follows before the
grammar's limit) the assertions leave open: the calls are some of `CALLS`, each once.
`MAX_TOKENS` is far above what the grammar's limit of calls takes, so a reply that ends
with `tool_calls` was ended by the grammar; `CUT` tokens end inside the first call (its
fixed text alone is about 30 tokens).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixmesh.router.http.openai.tools import PARALLEL_CALLS_LIMIT
from tests.router.agents.conftest import MODEL, AgentsCluster

pytestmark = pytest.mark.slow

PARIS: Any = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris"]}},
    "required": ["city"],
    "additionalProperties": False,
}
FUNCTIONS: Any = [
    {"name": "get_time", "description": "Get the local time in a city", "parameters": PARIS},
    {"name": "get_weather", "description": "Get the weather in a city", "parameters": PARIS},
]
CHAT_TOOLS: Any = [{"type": "function", "function": f} for f in FUNCTIONS]
RESPONSES_TOOLS: Any = [{"type": "function", **f} for f in FUNCTIONS]
ANTHROPIC_TOOLS: Any = [
    {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
    for f in FUNCTIONS
]
CALLS = {("get_time", '{"city": "Paris"}'), ("get_weather", '{"city": "Paris"}')}
ASK: Any = [{"role": "user", "content": "What time is it in Paris, and what is the weather?"}]
MAX_TOKENS = 1000
CUT = 8
GREEDY = {"temperature": 0}


def check_calls(calls: list[tuple[str, str]], most: int) -> None:
    """Calls of `CALLS`, none twice, at least one and at most `most`."""
    canonical = [(name, json.dumps(json.loads(arguments))) for name, arguments in calls]
    assert set(canonical) <= CALLS
    assert len(set(canonical)) == len(canonical)
    assert 1 <= len(canonical) <= most


# ---- chat completions -----------------------------------------------------------------------


def chat(agents: AgentsCluster, **kwargs: Any) -> tuple[Any, Any, str]:
    """The whole reply, the streamed one as the client assembles it, and the streamed
    content (its deltas joined)."""
    args = {"model": MODEL, "messages": ASK, "tools": CHAT_TOOLS, "temperature": 0} | kwargs
    whole = agents.openai.chat.completions.create(**args)
    with agents.openai.chat.completions.stream(**args) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "content.delta")
        streamed = stream.get_final_completion()
    return whole, streamed, deltas


@pytest.mark.parametrize("parallel", [True, False])
def test_chat_required_calls_end_the_reply(agents: AgentsCluster, parallel: bool) -> None:
    whole, streamed, deltas = chat(
        agents, tool_choice="required", parallel_tool_calls=parallel, max_tokens=MAX_TOKENS
    )
    assert deltas == ""
    for out in (whole, streamed):
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert not choice.message.content  # None whole, "" as the client joins a stream
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        check_calls(calls, PARALLEL_CALLS_LIMIT if parallel else 1)
        assert out.usage is None or out.usage.completion_tokens < MAX_TOKENS


def test_chat_named_tool_is_one_call(agents: AgentsCluster) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole, streamed, deltas = chat(
        agents, tool_choice=named, parallel_tool_calls=True, max_tokens=MAX_TOKENS
    )
    assert deltas == ""
    for out in (whole, streamed):
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert not choice.message.content
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        assert calls == [("get_weather", '{"city": "Paris"}')]


def test_chat_call_cut_by_max_tokens(agents: AgentsCluster) -> None:
    args: Any = {"model": MODEL, "messages": ASK, "tools": CHAT_TOOLS, "temperature": 0}
    args |= {"tool_choice": "required", "max_tokens": CUT}
    whole = agents.openai.chat.completions.create(**args)
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content == ""  # no half call in the content
    assert choice.message.tool_calls is None
    assert whole.usage is not None and whole.usage.completion_tokens == CUT
    # Streamed (the client's `stream` helper refuses a reply cut by the length limit).
    chunks = list(agents.openai.chat.completions.create(**args, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == ""
    assert [d.tool_calls for d in deltas if d.tool_calls] == []
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


# ---- Anthropic's Messages -------------------------------------------------------------------


def messages(agents: AgentsCluster, **kwargs: Any) -> tuple[Any, Any, list[str]]:
    """The whole message, the streamed one as the client assembles it, and the types of
    the streamed blocks."""
    args = {"model": MODEL, "messages": ASK, "tools": ANTHROPIC_TOOLS, "extra_body": GREEDY}
    whole = agents.anthropic.messages.create(**(args | kwargs))
    with agents.anthropic.messages.stream(**(args | kwargs)) as stream:
        blocks: list[str] = [
            e.content_block.type for e in stream if e.type == "content_block_start"
        ]
        streamed = stream.get_final_message()
    return whole, streamed, blocks


@pytest.mark.parametrize("parallel", [True, False])
def test_messages_tool_choice_any(agents: AgentsCluster, parallel: bool) -> None:
    choice = {"type": "any", "disable_parallel_tool_use": not parallel}
    whole, streamed, blocks = messages(agents, tool_choice=choice, max_tokens=MAX_TOKENS)
    assert set(blocks) == {"tool_use"}
    for m in (whole, streamed):
        assert m.stop_reason == "tool_use"
        assert {b.type for b in m.content} == {"tool_use"}  # no text block before the calls
        calls = [(b.name, json.dumps(b.input)) for b in m.content if b.type == "tool_use"]
        check_calls(calls, PARALLEL_CALLS_LIMIT if parallel else 1)
        assert m.usage.output_tokens < MAX_TOKENS


def test_messages_call_cut_by_max_tokens(agents: AgentsCluster) -> None:
    whole, streamed, blocks = messages(agents, tool_choice={"type": "any"}, max_tokens=CUT)
    assert blocks == ["text"]
    for m in (whole, streamed):
        assert m.stop_reason == "max_tokens"
        assert [(b.type, b.text) for b in m.content if b.type == "text"] == [("text", "")]
        assert len(m.content) == 1
    assert whole.usage.output_tokens == CUT


# ---- OpenAI's Responses ---------------------------------------------------------------------


def responses(agents: AgentsCluster, **kwargs: Any) -> tuple[Any, Any, str]:
    """The whole response, the streamed one as the client assembles it, and the streamed
    text (its deltas joined)."""
    args = {"model": MODEL, "input": ASK, "tools": RESPONSES_TOOLS, "temperature": 0} | kwargs
    whole = agents.openai.responses.create(**args)
    with agents.openai.responses.stream(**args) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        streamed = stream.get_final_response()
    return whole, streamed, deltas


@pytest.mark.parametrize("parallel", [True, False])
def test_responses_required_calls(agents: AgentsCluster, parallel: bool) -> None:
    whole, streamed, deltas = responses(
        agents, tool_choice="required", parallel_tool_calls=parallel, max_output_tokens=MAX_TOKENS
    )
    assert deltas == ""
    for r in (whole, streamed):
        assert (r.status, r.incomplete_details) == ("completed", None)
        assert {item.type for item in r.output} == {"function_call"}  # no message item
        check_calls(
            [(item.name, item.arguments) for item in r.output],
            PARALLEL_CALLS_LIMIT if parallel else 1,
        )


def test_responses_call_cut_by_max_output_tokens(agents: AgentsCluster) -> None:
    args: Any = {"model": MODEL, "input": ASK, "tools": RESPONSES_TOOLS, "temperature": 0}
    args |= {"tool_choice": "required", "max_output_tokens": CUT}
    whole = agents.openai.responses.create(**args)
    with agents.openai.responses.stream(**args) as stream:
        events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == ""
    assert events[-1].type == "response.incomplete"  # not `response.completed`
    for r in (whole, events[-1].response):
        assert r.status == "incomplete"
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"
        assert [item.type for item in r.output] == ["message"]
        assert r.output_text == ""
    assert whole.usage is not None and whole.usage.output_tokens == CUT
