"""`POST /v1/messages` through Anthropic's own client against a smollm2 router and worker.

Greedy decoding throughout (`temperature: 0`, sent as an extra body field: the client no
longer declares sampling fields); assertions are on structure and counts, and tool calls
are forced (`tool_choice` of type tool) so the output is a call by grammar, not by the
model's choice.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.router.agents.conftest import MODEL, AgentsCluster

GREEDY = {"temperature": 0}
SYSTEM = "You are a coding agent. Answer briefly."
READ_FILE: Any = {
    "name": "read_file",
    "description": "Read a file of the project",
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    },
}
FORCED: Any = {"type": "tool", "name": "read_file"}
TASK = "Read README.md, then main.py, then setup.py: one file per turn."


def prompt_tokens(usage: anthropic.types.Usage) -> int:
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_create_with_a_system_prompt(agents: AgentsCluster) -> None:
    client = agents.anthropic
    messages: Any = [{"role": "user", "content": "Name a colour."}]
    counted = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=messages)
    m = client.messages.create(
        model=MODEL, max_tokens=8, system=SYSTEM, messages=messages, extra_body=GREEDY
    )
    assert (m.type, m.role, m.model) == ("message", "assistant", MODEL)
    assert m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.stop_sequence is None
    # The system prompt is part of the prompt the worker saw: count_tokens agrees.
    assert prompt_tokens(m.usage) == counted.input_tokens
    longer = client.messages.count_tokens(
        model=MODEL, system=SYSTEM + " Be kind.", messages=messages
    )
    assert longer.input_tokens > counted.input_tokens
    assert m.usage.cache_creation_input_tokens == 0
    assert 1 <= m.usage.output_tokens <= 8
    if m.stop_reason == "max_tokens":
        assert m.usage.output_tokens == 8


def test_stop_sequences(agents: AgentsCluster) -> None:
    m = agents.anthropic.messages.create(
        model=MODEL,
        max_tokens=24,
        messages=[{"role": "user", "content": "Write a sentence about cats."}],
        stop_sequences=[" "],
        extra_body=GREEDY,
    )
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", " ")
    assert m.content[0].type == "text" and " " not in m.content[0].text


def test_stream_events_and_final_message(agents: AgentsCluster) -> None:
    with agents.anthropic.messages.stream(
        model=MODEL,
        max_tokens=12,
        messages=[{"role": "user", "content": "Say hello."}],
        extra_body=GREEDY,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events if e.type != "text"]  # "text": the client's own
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    deltas = [
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    ]
    assert final.content[0].type == "text" and final.content[0].text == "".join(deltas)
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= final.usage.output_tokens <= 12


def test_tool_use_and_tool_result_round_trip(agents: AgentsCluster) -> None:
    client = agents.anthropic
    ask: Any = {"role": "user", "content": TASK}
    first = client.messages.create(
        model=MODEL,
        max_tokens=64,
        system=SYSTEM,
        tools=[READ_FILE],
        tool_choice=FORCED,
        messages=[ask],
        extra_body=GREEDY,
    )
    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    assert len(uses) == 1
    use = uses[0]
    assert use.name == "read_file" and use.id.startswith("toolu_")
    assert set(use.input) == {"path"} and isinstance(use.input["path"], str)
    result: Any = {"type": "tool_result", "tool_use_id": use.id, "content": "# Project\n"}
    second = client.messages.create(
        model=MODEL,
        max_tokens=8,
        system=SYSTEM,
        tools=[READ_FILE],
        tool_choice={"type": "none"},
        messages=[
            ask,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ],
        extra_body=GREEDY,
    )
    assert [b.type for b in second.content] == ["text"]
    assert second.stop_reason in ("end_turn", "max_tokens")
    # The first turn's prompt came back from the radix cache (all but its last token).
    assert (second.usage.cache_read_input_tokens or 0) >= prompt_tokens(first.usage) - 1


def test_agent_loop_reads_more_from_the_cache_each_turn(agents: AgentsCluster) -> None:
    messages: list[Any] = [{"role": "user", "content": TASK}]
    cached, prompts = [], []
    for turn in range(3):
        m = agents.anthropic.messages.create(
            model=MODEL,
            max_tokens=64,
            system=SYSTEM,
            tools=[READ_FILE],
            tool_choice=FORCED,
            messages=messages,
            extra_body=GREEDY,
        )
        assert m.stop_reason == "tool_use"
        use = next(b for b in m.content if b.type == "tool_use")
        cached.append(m.usage.cache_read_input_tokens or 0)
        prompts.append(prompt_tokens(m.usage))
        messages.append({"role": "assistant", "content": m.content})
        result = {"type": "tool_result", "tool_use_id": use.id, "content": f"x = {turn}\n" * 4}
        messages.append({"role": "user", "content": [result]})
    print(f"messages agent loop: prompt tokens {prompts}, cached {cached}")  # -s shows it
    assert cached[0] < cached[1] < cached[2]
    for turn in (1, 2):  # each turn's history is the previous prompt, from the cache
        assert cached[turn] >= prompts[turn - 1] - 1


def test_errors_through_the_client(agents: AgentsCluster) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        agents.anthropic.messages.create(
            model="claude-opus-9", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        agents.anthropic.messages.create(
            model=MODEL,
            max_tokens=4,
            messages=[{"role": "bot", "content": "hi"}],  # type: ignore[misc, list-item]
        )
    assert "messages[0].role" in bad.value.body["error"]["message"]  # type: ignore[index]
