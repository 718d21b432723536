"""A forced reply that the token limit cuts after a call, its copy and half a third call,
scripted chunk by chunk (no cluster): each API keeps the complete call once, drops the
half call, puts no markup in any text, and says the reply was cut in its own terms."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from radixmesh.router.http.anthropic.convert import parse_messages
from radixmesh.router.http.anthropic.replies import MessageReply
from radixmesh.router.http.openai.blocks import Blocks, Call
from radixmesh.router.http.openai.convert import Generation, parse_chat
from radixmesh.router.http.openai.generation import _ChunkEvents, collect
from radixmesh.router.http.openai.message import MessageStream
from radixmesh.tokenizer import ByteTokenizer
from radixmesh.v1 import common_pb2

TOK = ByteTokenizer(256, eos_token_ids=[0])  # no tool section in its template: hermes
PARIS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CALL = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>'
CUT_REPLY = CALL + "\n" + CALL + '\n<tool_call>\n{"name": "get_time", "argu'
ARGUMENTS = '{"city": "Paris"}'
LENGTH = common_pb2.FINISH_REASON_LENGTH


def chunks(text: str, piece: int) -> list[common_pb2.GenerateChunk]:
    """`text` in pieces of `piece` characters (0: whole), the last cut by the token limit."""
    pieces = [text[i : i + piece] for i in range(0, len(text), piece)] if piece else [text]
    out = [
        common_pb2.GenerateChunk(text=p, token_ids=[1], prompt_tokens=20, completion_tokens=k + 1)
        for k, p in enumerate(pieces)
    ]
    out[-1].finish.CopyFrom(common_pb2.Finish(reason=LENGTH))
    return out


def chat_generation(stream: bool) -> Generation:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Time in Paris?"}],
        "tools": [{"type": "function", "function": {"name": "get_time", "parameters": PARIS}}],
        "tool_choice": "required",
        "max_tokens": 64,
        "stream": stream,
    }
    return parse_chat(body, tokenizer=TOK, context_length=4096)


def test_chat_whole_reply() -> None:
    async def replay() -> AsyncGenerator[tuple[int, common_pb2.GenerateChunk], None]:
        for c in chunks(CUT_REPLY, 0):
            yield 0, c

    reply = asyncio.run(collect(chat_generation(False), "chatcmpl-1", replay(), TOK))
    (choice,) = reply["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]
    ]
    assert calls == [("get_time", ARGUMENTS)]


@pytest.mark.parametrize("piece", [1, 5, 16])
def test_chat_stream(piece: int) -> None:
    events = _ChunkEvents(chat_generation(True), "chatcmpl-1", TOK)
    payloads = [p for c in chunks(CUT_REPLY, piece) for p in events.of(0, c)]
    deltas = [p["choices"][0]["delta"] for p in payloads]
    assert "".join(d.get("content") or "" for d in deltas) == ""
    calls = [
        (t["index"], t["function"]["name"], t["function"]["arguments"])
        for d in deltas
        for t in d.get("tool_calls") or []
    ]
    assert calls == [(0, "get_time", ARGUMENTS)]
    assert [p["choices"][0]["finish_reason"] for p in payloads][-1] == "length"


def anthropic_generation(stream: bool) -> Generation:
    body = {
        "model": "m",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Time in Paris?"}],
        "tools": [{"name": "get_time", "input_schema": PARIS}],
        "tool_choice": {"type": "any"},
        "stream": stream,
    }
    return parse_messages(body, tokenizer=TOK, context_length=4096)


@pytest.mark.parametrize("piece", [0, 1, 5, 16])
def test_anthropic_message(piece: int) -> None:
    reply = MessageReply(anthropic_generation(piece > 0), "msg_1")
    script = chunks(CUT_REPLY, piece)
    events = reply.opening(script[0])
    for c in script:
        events += reply.of(c)
    starts = [p["content_block"]["type"] for n, p in events if n == "content_block_start"]
    assert starts == ["tool_use"]  # no text block
    message = reply.message()
    assert [(b["type"], b["name"], b["input"]) for b in message["content"]] == [
        ("tool_use", "get_time", {"city": "Paris"})
    ]
    assert message["stop_reason"] == "max_tokens"
    (delta,) = [p for n, p in events if n == "message_delta"]
    assert delta["delta"]["stop_reason"] == "max_tokens"


@pytest.mark.parametrize("piece", [0, 1, 5, 16])
def test_blocks_of_the_agents_apis(piece: int) -> None:
    """Responses lays its output items out from these blocks, as Messages does."""
    blocks = Blocks(MessageStream.of(chat_generation(piece > 0)))
    script = chunks(CUT_REPLY, piece)
    events = [e for c in script for e in blocks.feed(c.text, c.HasField("finish"))]
    assert events == [Call(0, "get_time", ARGUMENTS)]


def test_a_cut_first_call_leaves_an_empty_text() -> None:
    cut = chunks('<tool_call>\n{"name": "get_ti', 4)
    blocks = Blocks(MessageStream.of(chat_generation(True)))
    events: list[Any] = [e for c in cut for e in blocks.feed(c.text, c.HasField("finish"))]
    assert [(type(e).__name__, getattr(e, "text", None)) for e in events] == [
        ("TextDelta", ""),
        ("TextEnd", ""),
    ]
