"""`POST /v1/responses` through OpenAI's own client against a smollm2 router and worker.

Greedy decoding throughout; assertions are on structure and counts; tool calls are forced
(`tool_choice: "required"`, one call) and structured output is held to its schema by the
grammar engine, so neither depends on the model's choices.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.router.agents.conftest import MODEL, AgentsCluster

INSTRUCTIONS = "You are a coding agent. Answer briefly."
READ_FILE: Any = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file of the project",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    },
}
TASK = "Read README.md, then main.py, then setup.py: one file per turn."
VERDICT = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


def create(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.responses.create(model=MODEL, temperature=0, **kwargs)


def test_create_plain(agents: AgentsCluster) -> None:
    r = create(agents.openai, input="What is 2 + 2?", max_output_tokens=8)
    assert (r.object, r.model) == ("response", MODEL)
    assert r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert [item.type for item in r.output] == ["message"]
    assert r.output[0].role == "assistant" and r.output_text
    usage = r.usage
    assert 0 <= usage.input_tokens_details.cached_tokens < usage.input_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 1 <= usage.output_tokens <= 8
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_stream_events_and_final_response(agents: AgentsCluster) -> None:
    fmt: Any = {"format": {"type": "json_schema", "name": "verdict", "schema": VERDICT}}
    with agents.openai.responses.stream(
        model=MODEL, input="Is the sky blue?", text=fmt, max_output_tokens=48, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.status == "completed" and final.output_text == deltas
    jsonschema.validate(json.loads(final.output_text), VERDICT)


def test_structured_output_is_valid_json(agents: AgentsCluster) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "year": {"type": "integer"}},
        "required": ["city", "year"],
        "additionalProperties": False,
    }
    fmt: Any = {"format": {"type": "json_schema", "name": "event", "schema": schema}}
    r = create(
        agents.openai,
        input="Where and when were the 1900 Olympics?",
        text=fmt,
        max_output_tokens=48,
    )
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


def test_function_call_output_round_trip(agents: AgentsCluster) -> None:
    client = agents.openai
    first = create(
        client,
        instructions=INSTRUCTIONS,
        input=TASK,
        tools=[READ_FILE],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=64,
    )
    assert first.status == "completed"
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "read_file"
    assert set(json.loads(calls[0].arguments)) == {"path"}
    assert calls[0].call_id.startswith("call_")
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "# Project\n"}
    second = create(
        client,
        instructions=INSTRUCTIONS,
        input=[{"role": "user", "content": TASK}, *first.output, output],
        tools=[READ_FILE],
        tool_choice="none",
        max_output_tokens=8,
        store=False,
    )
    assert [item.type for item in second.output] == ["message"]
    # The first turn's prompt came back from the radix cache (all but its last token).
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens - 1


def test_previous_response_id_and_store_false(agents: AgentsCluster) -> None:
    client = agents.openai
    first = create(client, input="My name is Ada.", max_output_tokens=6)
    second = create(
        client, previous_response_id=first.id, input="What is my name?", max_output_tokens=6
    )
    assert second.previous_response_id == first.id
    alone = create(client, input="What is my name?", max_output_tokens=6, store=False)
    # The first exchange is prepended: a longer prompt, its head from the cache.
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1
    with pytest.raises(openai.NotFoundError) as e:
        create(client, previous_response_id=alone.id, input="Again?", max_output_tokens=4)
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert e.value.body["code"] == "previous_response_not_found"  # type: ignore[index]


def test_agent_loop_reads_more_from_the_cache_each_turn(agents: AgentsCluster) -> None:
    previous, items = None, [{"role": "user", "content": TASK}]
    cached, prompts = [], []
    for turn in range(3):
        r = create(
            agents.openai,
            instructions=INSTRUCTIONS,
            input=items,
            previous_response_id=previous,
            tools=[READ_FILE],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=64,
        )
        call = r.output[-1]
        assert r.status == "completed" and call.type == "function_call"
        cached.append(r.usage.input_tokens_details.cached_tokens)
        prompts.append(r.usage.input_tokens)
        previous = r.id
        items = [
            {"type": "function_call_output", "call_id": call.call_id, "output": f"x = {turn}\n" * 4}
        ]
    print(f"responses agent loop: prompt tokens {prompts}, cached {cached}")  # -s shows it
    assert cached[0] < cached[1] < cached[2]
    for turn in (1, 2):  # each turn's history is the previous prompt, from the cache
        assert cached[turn] >= prompts[turn - 1] - 1


def test_errors_through_the_client(agents: AgentsCluster) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        agents.openai.responses.create(model="gpt-9", input="hi")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    bot: Any = [{"role": "bot", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as bad:
        agents.openai.responses.create(model=MODEL, input=bot)
    assert bad.value.body["param"] == "input[0].role"  # type: ignore[index]
