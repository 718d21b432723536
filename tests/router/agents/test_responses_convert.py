"""Responses requests -> prompts and sampling parameters, worker chunks -> the reply and
its events, and the store behind previous_response_id, without a cluster."""

from __future__ import annotations

import json
from typing import Any

from radixmesh.router.http.openai.convert import Generation
from radixmesh.router.http.openai.responses_api import requests as rq
from radixmesh.router.http.openai.responses_api.convert import generation_of, parse_request
from radixmesh.router.http.openai.responses_api.output import ResponseReply, echoed
from radixmesh.router.http.openai.responses_api.store import ResponseStore
from radixmesh.tokenizer import ByteTokenizer
from radixmesh.v1 import common_pb2

TOK = ByteTokenizer(256, eos_token_ids=[0])
TOOL = {
    "type": "function",
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}


def request(**body: Any) -> rq.ResponsesRequest:
    return parse_request({"model": "m", "input": "hi"} | body)


def parse(history: tuple[rq.Item, ...] = (), **body: Any) -> Generation:
    return generation_of(request(**body), history, tokenizer=TOK, context_length=4096)


def prompt(gen: Generation) -> str:
    return TOK.decode(gen.prompts[0])


def test_items_render_as_chat() -> None:
    gen = parse(
        instructions="Be terse.",
        tools=[TOOL],
        input=[
            {"role": "user", "content": "Find cats."},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Looking."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "lookup",
                "arguments": '{"q": "cats"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "3 cats"},
        ],
        max_output_tokens=7,
        temperature=0.0,
    )
    text = prompt(gen)
    assert text.startswith("<|system|>\nBe terse.\n\nYou can call functions")
    call = '<tool_call>\n{"name": "lookup", "arguments": {"q": "cats"}}\n</tool_call>'
    assert text.endswith(
        f"<|user|>\nFind cats.\n<|assistant|>\nLooking.\n{call}\n"
        "<|user|>\n<tool_response>\n3 cats\n</tool_response>\n<|assistant|>\n"
    )
    assert (gen.params[0].max_new_tokens, gen.params[0].temperature) == (7, 0.0)


def test_history_comes_first_and_formats_constrain() -> None:
    history = (
        rq.MessageItem(role="user", content=[rq.InputText(type="input_text", text="one")]),
        rq.MessageItem(role="assistant", content=[rq.InputText(type="output_text", text="two")]),
    )
    gen = parse(history, input="three", instructions="new")
    assert (
        prompt(gen)
        == "<|system|>\nnew\n<|user|>\none\n<|assistant|>\ntwo\n<|user|>\nthree\n<|assistant|>\n"
    )
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    shaped = parse(text={"format": {"type": "json_schema", "name": "n", "schema": schema}})
    assert json.loads(shaped.params[0].json_schema) == schema
    assert parse(text={"format": {"type": "text"}}).params[0].json_schema == ""
    forced = parse(tools=[TOOL], tool_choice={"type": "function", "name": "lookup"})
    assert '"name": "lookup"' in json.loads(forced.params[0].structural_tag)["format"]["begin"]


def test_speculative_passes_through() -> None:
    params = parse(speculative=False).params[0]
    assert (params.HasField("speculative"), params.speculative) == (True, False)
    assert parse().params[0].HasField("speculative") is False


# ---- replies ----------------------------------------------------------------------------


def chunk(text: str, done: int, reason: int = 0) -> common_pb2.GenerateChunk:
    c = common_pb2.GenerateChunk(
        text=text, prompt_tokens=40, cached_tokens=32, completion_tokens=done
    )
    if reason:
        c.finish.CopyFrom(common_pb2.Finish(reason=reason))  # type: ignore[arg-type]
    return c


def run(
    req: rq.ResponsesRequest, chunks: list[common_pb2.GenerateChunk]
) -> tuple[list[dict[str, Any]], ResponseReply]:
    gen = generation_of(req, (), tokenizer=TOK, context_length=4096)
    reply = ResponseReply(gen, "resp_1", echoed(req))
    out = reply.opening()
    for c in chunks:
        out += reply.of(c)
    assert [p["sequence_number"] for _, p in out] == list(range(len(out)))
    assert all(p["type"] == name for name, p in out)
    return [p for _, p in out], reply


STOP, LENGTH = common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH


def test_text_events_and_response() -> None:
    got, reply = run(request(stream=True), [chunk("Hi", 1), chunk(" there", 2), chunk("", 3, STOP)])
    assert [e["type"] for e in got] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert got[0]["response"]["status"] == "in_progress"
    assert got[6]["text"] == "Hi there"
    final = got[-1]["response"]
    assert final == reply.response()
    assert final["output"][0]["content"][0]["text"] == "Hi there"
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 32
    assert (final["usage"]["input_tokens"], final["usage"]["total_tokens"]) == (40, 43)
    stored = reply.items()
    assert isinstance(stored[0], rq.MessageItem) and stored[0].role == "assistant"


def test_call_events_and_incomplete() -> None:
    call = '<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>'
    got, reply = run(request(tools=[TOOL], stream=True), [chunk(call, 20), chunk("", 21, STOP)])
    assert [e["type"] for e in got[2:]] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    item = got[-1]["response"]["output"][0]
    assert (item["type"], item["name"], json.loads(item["arguments"])) == (
        "function_call",
        "lookup",
        {"q": "x"},
    )
    assert item["call_id"].startswith("call_") and got[2]["item"]["arguments"] == ""
    assert isinstance(reply.items()[0], rq.FunctionCallItem)
    got, reply = run(request(), [chunk("cut sho", 4, LENGTH)])
    assert got[-1]["type"] == "response.incomplete"
    assert reply.response()["incomplete_details"] == {"reason": "max_output_tokens"}
    assert reply.response()["output"][0]["status"] == "incomplete"


# ---- the store --------------------------------------------------------------------------


def items(text: str) -> tuple[rq.Item, ...]:
    return (rq.MessageItem(role="user", content=[rq.InputText(type="input_text", text=text)]),)


def test_store_bounds_and_callers() -> None:
    now = [0.0]
    store = ResponseStore(max_bytes=1000, ttl=10.0, clock=lambda: now[0])
    assert store.put("alice", "r1", items("a" * 300))
    assert store.get("alice", "r1") == items("a" * 300)
    assert store.get("bob", "r1") is None  # another caller's id is unknown
    assert store.put("alice", "r2", items("b" * 300))
    assert store.put("alice", "r3", items("c" * 300))  # over the budget: r1 goes
    assert store.get("alice", "r1") is None and store.get("alice", "r2") is not None
    assert store.bytes <= 1000
    assert not store.put("alice", "big", items("d" * 2000))  # alone over the budget
    now[0] = 10.0
    assert store.get("alice", "r3") is None and len(store) == 0 and store.bytes == 0


def test_one_conversation_is_one_prompt_over_every_api() -> None:
    """Chat, Messages and Responses render the same conversation to the same token ids, so
    an agent moving between the APIs keeps its prefix in the radix cache."""
    from radixmesh.router.http.anthropic.convert import parse_messages
    from radixmesh.router.http.openai.convert import parse_chat

    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"q": "x"}'},
    }
    chat = parse_chat(
        {
            "model": "m",
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "lookup", "parameters": TOOL["parameters"]},
                }
            ],
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "U"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "R"},
            ],
        },
        tokenizer=TOK,
        context_length=4096,
    )
    anthropic = parse_messages(
        {
            "model": "m",
            "max_tokens": 4,
            "system": "S",
            "tools": [{"name": "lookup", "input_schema": TOOL["parameters"]}],
            "messages": [
                {"role": "user", "content": "U"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"q": "x"}}
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "R"}],
                },
            ],
        },
        tokenizer=TOK,
        context_length=4096,
    )
    responses = parse(
        instructions="S",
        tools=[TOOL],
        input=[
            {"role": "user", "content": "U"},
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": "x"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "R"},
        ],
    )
    assert chat.prompts == anthropic.prompts == responses.prompts
