"""Anthropic Messages requests -> prompts and sampling parameters, and worker chunks ->
the reply and its events, without a cluster (a byte tokenizer: its template is plain
text, and it has no tool section, so tools take the hermes fallback)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.router.http.anthropic.convert import count_tokens, field_name, parse_messages
from radixmesh.router.http.anthropic.replies import MessageReply
from radixmesh.router.http.openai.convert import Generation
from radixmesh.tokenizer import ByteTokenizer
from radixmesh.v1 import common_pb2

TOK = ByteTokenizer(256, eos_token_ids=[0])
WEATHER = {
    "name": "get_weather",
    "description": "The weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def parse(**body: Any) -> Generation:
    base: dict[str, Any] = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    return parse_messages(base | body, tokenizer=TOK, context_length=4096)


def prompt(gen: Generation) -> str:
    return TOK.decode(gen.prompts[0])


def refused(field: str, **body: Any) -> str:
    with pytest.raises(InvalidArgument) as e:
        parse(**body)
    assert e.value.field == field, e.value
    return e.value.message


def test_system_blocks_and_sampling_fields() -> None:
    gen = parse(
        system=[{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Be kind."}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
        stop_sequences=["\n\n"],
        temperature=0.0,
        top_k=5,
        metadata={"user_id": "x"},
    )
    assert prompt(gen) == "<|system|>\nBe terse.\n\nBe kind.\n<|user|>\na\n\nb\n<|assistant|>\n"
    params = gen.params[0]
    assert (params.max_new_tokens, list(params.stop), params.top_k) == (8, ["\n\n"], 5)
    assert params.temperature == 0.0
    assert not gen.stream


def test_speculative_passes_through_and_a_bad_one_is_named() -> None:
    params = parse(speculative=False).params[0]
    assert (params.HasField("speculative"), params.speculative) == (True, False)
    assert parse().params[0].HasField("speculative") is False
    assert refused("speculative", speculative="x") == "Input should be a valid boolean"


def test_tool_use_and_results_render_in_order() -> None:
    gen = parse(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "22C"}],
                    },
                    {"type": "text", "text": "And Rome?"},
                ],
            },
        ],
    )
    text = prompt(gen)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert f"<|assistant|>\nLet me look.\n{call}\n" in text
    assert text.endswith(
        "<|user|>\n<tool_response>\n22C\n</tool_response>\n<|user|>\nAnd Rome?\n<|assistant|>\n"
    )
    assert '"name": "get_weather"' in text.split("<|user|>")[0]  # the tools, in the system prompt
    assert gen.tool_plan is not None and gen.tool_plan.structural_tag is None  # auto: parsed


def test_tool_choice_maps_to_chat() -> None:
    forced = parse(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    tag = json.loads(forced.params[0].structural_tag)
    assert tag["format"]["begin"].startswith('<tool_call>\n{"name": "get_weather"')
    anyone = parse(tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert json.loads(anyone.params[0].structural_tag)["format"]["type"] == "tag"  # one call
    none = parse(tools=[WEATHER], tool_choice={"type": "none"})
    assert none.tool_plan is not None and none.tool_plan.parser is None


def test_error_result_and_prefill() -> None:
    gen = parse(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": True}
                ],
            },
            {"role": "assistant", "content": "The answer is"},
        ]
    )
    assert prompt(gen).endswith(
        "<tool_response>\nError: boom\n</tool_response>\n<|assistant|>\nThe answer is"
    )


def test_errors_name_anthropic_fields() -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_messages(
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            tokenizer=TOK,
            context_length=64,
        )
    assert e.value.field == "max_tokens"
    assert refused("messages[0].role", messages=[{"role": "system", "content": "x"}])
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    assert "image blocks are not supported" in refused("messages[0].content[1]", messages=[
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}
    ])  # fmt: skip
    assert "type must be one of text, image" in refused(
        "messages[0].content[0]", messages=[{"role": "user", "content": [{"type": "video"}]}]
    )
    assert refused(
        "messages[0].content[0].text", messages=[{"role": "user", "content": [{"type": "text"}]}]
    )
    use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    assert refused("messages[0].content[0].type", messages=[{"role": "user", "content": [use]}])
    assert refused("tools[0].type", tools=[{"type": "web_search_20250305", "name": "web_search"}])
    bad_schema = {**WEATHER, "input_schema": {"type": "object", "properties": 3}}
    assert "not a valid JSON Schema" in refused("tools[0].input_schema", tools=[bad_schema])
    assert refused("tool_choice", tool_choice={"type": "any"})
    assert refused("tool_choice.name", tools=[WEATHER], tool_choice={"type": "tool"})
    assert refused("stop_sequences", stop_sequences=[""])
    assert refused("temperature", temperature=-1.0)
    assert refused("mcp_servers", mcp_servers=[{"type": "url"}])


def test_field_names() -> None:
    assert field_name("tools[3].function.parameters") == "tools[3].input_schema"
    assert field_name("response_format") == "output_config.format"
    assert field_name("messages[4].content") == "messages"
    assert field_name("max_tokens") == "max_tokens"


def test_count_tokens_is_the_prompt() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert count_tokens(body, tokenizer=TOK, context_length=4096) == len(
        "<|user|>\nhi\n<|assistant|>\n"
    )


# ---- replies ----------------------------------------------------------------------------


def chunk(text: str, done: int = 0, **finish: Any) -> common_pb2.GenerateChunk:
    c = common_pb2.GenerateChunk(
        text=text, prompt_tokens=30, cached_tokens=12, completion_tokens=done
    )
    if finish:
        c.finish.CopyFrom(common_pb2.Finish(**finish))
    return c


STOP = common_pb2.FINISH_REASON_STOP


def events(
    gen: Generation, chunks: list[common_pb2.GenerateChunk]
) -> tuple[list[dict[str, Any]], MessageReply]:
    reply = MessageReply(gen, "msg_1")
    out = reply.opening(chunks[0])
    for c in chunks:
        out += reply.of(c)
    for name, payload in out:
        assert payload["type"] == name
    return [payload for _, payload in out], reply


def test_text_events_and_message() -> None:
    chunks = [chunk("Hel", 1), chunk("lo.", 2), chunk("", 3, reason=STOP, matched_text="\n\n")]
    got, reply = events(parse(stream=True), chunks)
    assert [e["type"] for e in got] == [
        "message_start", "ping", "content_block_start", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert got[0]["message"]["usage"] == {
        "input_tokens": 18,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 12,
    }
    assert [e["delta"]["text"] for e in got[3:5]] == ["Hel", "lo."]
    assert got[6]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "\n\n"}
    assert got[6]["usage"]["output_tokens"] == 3
    message = reply.message()
    assert message["content"] == [{"type": "text", "text": "Hello."}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "\n\n")


def test_tool_call_events() -> None:
    gen = parse(tools=[WEATHER], stream=True)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    chunks = [
        chunk("Sure.\n", 1),
        chunk(call[:20], 2),
        chunk(call[20:] + "\n", 3),
        chunk("", 4, reason=STOP),
    ]
    got, reply = events(gen, chunks)
    kinds = [(e["type"], e.get("index")) for e in got[2:]]
    assert kinds == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("message_delta", None), ("message_stop", None),
    ]  # fmt: skip
    start = got[5]["content_block"]
    assert (start["type"], start["name"], start["input"]) == ("tool_use", "get_weather", {})
    assert start["id"].startswith("toolu_")
    assert json.loads(got[6]["delta"]["partial_json"]) == {"city": "Paris"}
    content = reply.message()["content"]
    assert content[0] == {"type": "text", "text": "Sure.\n"}
    assert (content[1]["name"], content[1]["input"]) == ("get_weather", {"city": "Paris"})
    assert reply.message()["stop_reason"] == "tool_use"


def test_whole_reply_matches_and_edge_cases() -> None:
    gen = parse(tools=[WEATHER])
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    _, reply = events(gen, [chunk("\n" + call + "\n", 9, reason=STOP)])
    content = reply.message()["content"]
    assert [b["type"] for b in content] == ["tool_use"]  # whitespace around calls: no block
    _, empty = events(parse(), [chunk("", 0, reason=common_pb2.FINISH_REASON_LENGTH)])
    assert empty.message()["content"] == [{"type": "text", "text": ""}]
    assert empty.message()["stop_reason"] == "max_tokens"
    with pytest.raises(Unavailable, match="aborted"):
        events(parse(), [chunk("x", 1, reason=common_pb2.FINISH_REASON_ABORT, message="drained")])
