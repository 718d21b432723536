"""Responses requests -> prompts and sampling parameters, worker chunks -> the reply and
its events (logprobs included), without a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.openai.convert import Generation
from radixmesh.router.http.openai.reply import chat_logprobs
from radixmesh.router.http.openai.responses_api import requests as rq
from radixmesh.router.http.openai.responses_api.convert import (
    count_input_tokens,
    generation_of,
    parse_count_request,
    parse_request,
)
from radixmesh.router.http.openai.responses_api.output import ResponseReply, echoed
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
    reply = ResponseReply(gen, "resp_1", echoed(req), TOK)
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
    assert final["output"][0]["content"][0]["logprobs"] == [] and got[4]["logprobs"] == []
    # The output goes back in as input items (a stored conversation, sent back as is).
    back = rq.items_of(final["output"])
    assert isinstance(back[0], rq.MessageItem) and back[0].role == "assistant"
    assert back[0].id == final["output"][0]["id"]


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
    back = rq.items_of(reply.response()["output"])
    assert isinstance(back[0], rq.FunctionCallItem) and back[0].call_id == item["call_id"]
    got, reply = run(request(), [chunk("cut sho", 4, LENGTH)])
    assert got[-1]["type"] == "response.incomplete"
    assert reply.response()["incomplete_details"] == {"reason": "max_output_tokens"}
    assert reply.response()["output"][0]["status"] == "incomplete"


# ---- logprobs ---------------------------------------------------------------------------


def lp_chunk(
    text: str, tokens: list[tuple[int, float]], done: int, reason: int = 0
) -> common_pb2.GenerateChunk:
    """A chunk of `tokens` (id, logprob), each with itself and id 0 as its top two."""
    c = chunk(text, done, reason)
    for tid, lp in tokens:
        c.logprobs.add(token_id=tid, logprob=lp)
        top = c.top_logprobs.add()
        top.tokens.add(token_id=tid, logprob=lp)
        top.tokens.add(token_id=0, logprob=lp - 1.0)
    return c


def test_logprobs_follow_the_text() -> None:
    chunks = [
        lp_chunk(" ", [(32, -0.5)], 1),  # whitespace first: held by the blocks
        lp_chunk("Hi", [(72, -0.25), (105, -0.125)], 3),
        lp_chunk("", [(0, -2.0)], 4, STOP),  # the end-of-text token: no text
    ]
    got, reply = run(request(stream=True, top_logprobs=1), chunks)
    deltas = [e for e in got if e["type"] == "response.output_text.delta"]
    assert [(d["delta"], [t["token"] for t in d["logprobs"]]) for d in deltas] == [
        (" Hi", [" ", "H", "i"])
    ]
    assert deltas[0]["logprobs"][0] == {
        "token": " ",
        "logprob": -0.5,
        "top_logprobs": [{"token": " ", "logprob": -0.5}, {"token": "\x00", "logprob": -1.5}],
    }
    part = reply.response()["output"][0]["content"][0]
    # The part's logprobs are the chat completion's, token for token.
    assert part["logprobs"] == [lp.model_dump() for c in chunks for lp in chat_logprobs(c, TOK)]
    assert [t["token"] for t in part["logprobs"]] == [" ", "H", "i", "\x00"]
    assert part["logprobs"][1]["bytes"] == [72]
    done = next(e for e in got if e["type"] == "response.output_text.done")
    assert [t["token"] for t in done["logprobs"]] == [" ", "H", "i", "\x00"]
    assert got[-1]["response"]["top_logprobs"] == 1


def test_logprobs_are_asked_by_include_or_top_logprobs() -> None:
    assert parse(include=["message.output_text.logprobs"]).top_logprobs == 0
    assert parse(top_logprobs=3).top_logprobs == 3
    assert parse(include=["reasoning.encrypted_content"]).top_logprobs is None
    params = parse(top_logprobs=2).params[0]
    assert (params.return_logprob, params.top_logprobs_num) == (True, 2)
    # The text without calls to parse: tool_choice none keeps logprobs.
    assert parse(tools=[TOOL], tool_choice="none", top_logprobs=1).top_logprobs == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tools": [TOOL], "top_logprobs": 1}, "top_logprobs"),
        ({"tools": [TOOL], "include": ["message.output_text.logprobs"]}, "include"),
        ({"include": ["message.output_text.tokens"]}, "include[0]"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
    ],
)
def test_refused_fields_are_named(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse(**body)
    assert e.value.field == field


def test_input_tokens_count_the_prompt_a_create_makes() -> None:
    history = (rq.MessageItem(role="user", content=[rq.InputText(type="input_text", text="one")]),)
    body = {"instructions": "new", "input": "three", "tools": [TOOL]}
    req = parse_count_request(body)
    count = count_input_tokens(req, history, tokenizer=TOK, context_length=4096)
    assert count == len(parse(history, **body).prompts[0])
    alone = count_input_tokens(
        parse_count_request({"input": "hi"}), (), tokenizer=TOK, context_length=4096
    )
    assert alone == len("<|user|>\nhi\n<|assistant|>\n")
    with pytest.raises(InvalidArgument) as e:
        count_input_tokens(parse_count_request({}), (), tokenizer=TOK, context_length=4096)
    assert e.value.field == "input"


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
