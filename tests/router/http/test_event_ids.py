"""Resumable Anthropic and Responses streams (event_ids.py), without a cluster: a stream is
cut after each of its events in turn and resumed from a replay chunked otherwise (all
in one, in twos, as it first came); the events before the cut and the resumed ones are
the uninterrupted stream's, up to how the text deltas are cut."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.dispatch import StreamRef
from radixmesh.router.http.anthropic.convert import parse_messages
from radixmesh.router.http.anthropic.replies import MessageReply
from radixmesh.router.http.event_ids import EventId, EventReply, IdentifiedEvents, resumption
from radixmesh.router.http.openai.convert import Generation
from radixmesh.router.http.openai.generation import _ChunkEvents, _ReplayedChoice
from radixmesh.router.http.openai.responses_api.convert import generation_of, parse_request
from radixmesh.router.http.openai.responses_api.output import ResponseReply, echoed
from radixmesh.router.http.openai.tool_parsers import HermesParser
from radixmesh.router.http.openai.tools import ToolPlan
from radixmesh.tokenizer import ByteTokenizer
from radixmesh.v1 import common_pb2

TOK = ByteTokenizer(256, eos_token_ids=[0])
STREAM_ID = "00000000000000ab/" + "c" * 32
STOP, LENGTH = common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH
# What the worker's chunks carry, as (text, completion tokens so far): leading
# whitespace (held until text comes), an empty chunk, a multi-byte character.
SCRIPT = [("", 1), ("  ", 2), ("Hi", 3), (" thé", 5), ("", 6), ("re!", 7), ("\n", 8)]

Item = tuple[tuple[str, dict[str, Any]], str | None]


def chunk(text: str, done: int, reason: int = 0) -> common_pb2.GenerateChunk:
    c = common_pb2.GenerateChunk(
        text=text, prompt_tokens=40, cached_tokens=8, completion_tokens=done
    )
    if reason:
        c.finish.CopyFrom(common_pb2.Finish(reason=reason))  # type: ignore[arg-type]
    return c


def script(reason: int) -> list[common_pb2.GenerateChunk]:
    chunks = [chunk(text, done) for text, done in SCRIPT]
    return [*chunks, chunk("", 9, reason)]


def joined(chunks: list[common_pb2.GenerateChunk], size: int) -> list[common_pb2.GenerateChunk]:
    """The chunks joined `size` at a time (as a worker or a router joins what it finds)."""
    out = []
    for i in range(0, len(chunks), size):
        group = chunks[i : i + size]
        c = chunk("".join(g.text for g in group), group[-1].completion_tokens)
        if group[-1].HasField("finish"):
            c.finish.CopyFrom(group[-1].finish)
        out.append(c)
    return out


def anthropic_reply() -> MessageReply:
    body = {"model": "m", "max_tokens": 9, "stream": True}
    body["messages"] = [{"role": "user", "content": "hi"}]
    gen = parse_messages(body, tokenizer=TOK, context_length=4096)
    return MessageReply(gen, "msg_1")


def responses_reply() -> ResponseReply:
    req = parse_request({"model": "m", "input": "hi", "stream": True})
    gen = generation_of(req, (), tokenizer=TOK, context_length=4096)
    return ResponseReply(gen, "resp_1", echoed(req), TOK)


def run(
    reply: EventReply, chunks: list[common_pb2.GenerateChunk], after: EventId | None = None
) -> list[Item]:
    events = IdentifiedEvents(reply, StreamRef(STREAM_ID), after)
    if isinstance(reply, ResponseReply):
        reply.created = events.created
    return [item for c in chunks for item in events.of(c)]


def merged(items: list[Item]) -> list[dict[str, Any]]:
    """The events' payloads, consecutive text deltas of one block joined into one, without
    the sequence numbers (checked on their own)."""
    out: list[dict[str, Any]] = []
    for (_, payload), _ in items:
        p = {k: v for k, v in payload.items() if k != "sequence_number"}
        prev = out[-1] if out else {}
        if p["type"] == "content_block_delta" and prev.get("type") == p["type"]:
            prev["delta"] = prev["delta"] | {"text": prev["delta"]["text"] + p["delta"]["text"]}
        elif p["type"] == "response.output_text.delta" and prev.get("type") == p["type"]:
            prev["delta"] += p["delta"]
        else:
            out.append(p)
    return out


@pytest.mark.parametrize("make", [anthropic_reply, responses_reply])
@pytest.mark.parametrize("reason", [STOP, LENGTH])
@pytest.mark.parametrize("size", [1, 2, 3, 100])
def test_a_cut_after_any_event_resumes_with_the_events_after_it(
    make: Callable[[], EventReply], reason: int, size: int
) -> None:
    chunks = script(reason)
    whole = run(make(), chunks)
    assert all(event_id is not None for _, event_id in whole)
    assert [EventId.parse(str(i)).sent for _, i in whole] == list(range(1, len(whole) + 1))
    for cut in range(1, len(whole)):
        before = whole[:cut]
        after = EventId.parse(str(before[-1][1]))
        rest = run(make(), joined(chunks, size), after)
        got = before + rest
        assert merged(got) == merged(whole), cut
        # The stream's last event (the message's stop, the finished response) is the same
        # (but for its number: the replay's text may come in fewer deltas).
        assert merged(got[-1:]) == merged(whole[-1:])
        if size == 1:  # a replay chunked as the stream first was: the very same events
            assert rest == whole[cut:]
        if make is responses_reply:
            numbers = [payload["sequence_number"] for (_, payload), _ in got]
            assert numbers == list(range(len(got)))
        else:  # no second message_start
            assert [name for (name, _), _ in got].count("message_start") == 1


def test_a_resume_after_the_last_event_sends_nothing() -> None:
    chunks = script(STOP)
    whole = run(anthropic_reply(), chunks)
    after = EventId.parse(str(whole[-1][1]))
    assert run(anthropic_reply(), joined(chunks, 100), after) == []


def test_event_ids_name_the_header_when_malformed() -> None:
    good = EventId(STREAM_ID, 1700000000, 12, 1, 5)
    assert EventId.parse(str(good)) == good
    for bad in ["", STREAM_ID, f"{STREAM_ID}/1/2/3", f"{STREAM_ID}/1/2/x/4", "a/b/1/1/1/1"]:
        with pytest.raises(InvalidArgument) as e:
            EventId.parse(bad)
        assert e.value.field == "Last-Event-ID"
    with pytest.raises(InvalidArgument):
        EventId.parse(f"{STREAM_ID}/1/2/5/4")  # more of a chunk's events than in all


def test_streams_with_tools_or_logprobs_refuse_a_resume() -> None:
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    bodies: list[dict[str, Any]] = [{"tools": [tool]}, {"top_logprobs": 2}]
    for body in bodies:
        req = parse_request({"model": "m", "input": "hi", "stream": True} | body)
        gen = generation_of(req, (), tokenizer=TOK, context_length=4096)
        assert resumption(gen, None) == (None, None)
        with pytest.raises(InvalidArgument) as e:
            resumption(gen, f"{STREAM_ID}/1/0/0/1")
        assert e.value.field == "Last-Event-ID"
        assert "only a stream of plain text resumes" in e.value.message


def test_the_opening_events_describe_the_response_before_its_output() -> None:
    """A stream whose first chunk is its last: `response.created` was built before the
    chunk's events, and still has no output when sent."""
    items = run(responses_reply(), [chunk("Hi", 1, LENGTH)])
    (_, created), _ = items[0]
    assert created["type"] == "response.created" and created["response"]["output"] == []
    (_, last), _ = items[-1]
    assert [part["text"] for part in last["response"]["output"][0]["content"]] == ["Hi"]


# A reasoning model's reply with a call between two texts, as a hermes template writes it.
CHAT_TEXT = (
    "<think>Which city?\nParis.</think>\n\nLet me look.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\nDone: sunny.'
)


def chat_reply() -> _ReplayedChoice:
    gen = Generation(
        chat=True,
        model="m",
        prompts=[[1, 2, 3]],
        params=[common_pb2.SamplingParams()],
        n=1,
        stream=True,
        include_usage=True,
        continuous_usage=False,
        top_logprobs=None,
        tool_plan=ToolPlan(HermesParser(), None),
        reasoning_tail="",
    )
    return _ReplayedChoice(_ChunkEvents(gen, "chatcmpl-1", TOK))


def chat_view(items: list[Item]) -> tuple[str, str, list[tuple[str, str]], list[Any]]:
    """What a chat client puts together: content, reasoning, calls, finish reasons."""
    content = reasoning = ""
    calls: list[tuple[str, str]] = []
    reasons = []
    for (_, payload), _ in items:
        (choice,) = payload["choices"]
        delta = choice["delta"]
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning_content") or ""
        calls += [
            (c["function"]["name"], c["function"]["arguments"])
            for c in delta.get("tool_calls") or []
        ]
        reasons.append(choice["finish_reason"])
    return content, reasoning, calls, [r for r in reasons if r is not None]


@pytest.mark.parametrize("size", [1, 3, 7, 100])
def test_a_chat_stream_with_tools_and_reasoning_resumes_after_any_event(size: int) -> None:
    """Its deltas depend on the text before them (a call is let out whole, reasoning split
    off): a replay chunked otherwise still gives the client each part once."""
    chunks = [chunk(CHAT_TEXT[i : i + 5], i // 5 + 1) for i in range(0, len(CHAT_TEXT), 5)]
    chunks.append(chunk("", len(chunks) + 1, STOP))
    whole = run(chat_reply(), chunks)
    content, reasoning, calls, reasons = chat_view(whole)
    assert (content, reasoning) == ("Let me look.\nDone: sunny.", "Which city?\nParis.")
    assert calls == [("get_weather", '{"city": "Paris"}')] and reasons == ["tool_calls"]
    for cut in range(1, len(whole)):
        rest = run(chat_reply(), joined(chunks, size), EventId.parse(str(whole[cut - 1][1])))
        assert chat_view(whole[:cut] + rest) == chat_view(whole), cut
        assert whole[0][0][1]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all(p["choices"][0]["delta"].get("role") is None for (_, p), _ in rest)
