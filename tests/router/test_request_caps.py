"""The router's caps on what one request may hold (router/limits.py), checked before
anything parses, renders or tokenizes it, each a 400 naming the field that is too long:
`messages`, `tools`, the token ids of `prompt` / `input` / `input_ids` / `tokens`, a text
prompt far past the context; a prompt that alone fills the context names its own field,
not `max_tokens`.

The router's real HTTP front end on loopback without workers (tests/router/http/openai/
frontend.py): a request that passes is routed and gets 503. A byte tokenizer makes token
counts exact (one token per byte). The gRPC input's caps are checked on the shared reader.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.nesting import json_depth
from radixmesh.router.limits import RequestLimits
from radixmesh.sampling_params import SamplingParams
from radixmesh.tokenizer import ByteTokenizer
from radixmesh.v1 import common_pb2
from radixmesh.wire import input_ids_from_proto
from tests.router.http.openai.frontend import Frontend

MODEL = "dummy:tiny"
CONTEXT = 64
CAPS = {"max_messages": 8, "max_tools": 4, "max_prompt_tokens": 100, "max_prompt_bytes": 4096}


@pytest.fixture(scope="module")
def front() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), MODEL, context_length=CONTEXT, **CAPS)
    yield f
    f.close()


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def _tool(i: int, description: str = "") -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"f{i}", "description": description}}


CASES = [
    # (path, body, status, param, a part of the message)
    ("/v1/chat/completions", _chat(messages=[{"role": "user", "content": "a"}] * 9), 400,
     "messages", "9 messages; at most 8 per request"),
    ("/v1/chat/completions", _chat(tools=[_tool(i) for i in range(5)]), 400,
     "tools", "5 tools; at most 4 per request"),
    ("/tokenize", {"messages": [{"role": "user", "content": "a"}] * 9}, 400,
     "messages", "9 messages"),
    ("/v1/completions", {"model": MODEL, "prompt": [5] * 65}, 400,
     "prompt", "65 token ids; the model's context is 64 tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": [[5] * 10, [5] * 65]}, 400,
     "prompt[1]", "65 token ids"),
    ("/v1/completions", {"model": MODEL, "prompt": [[5] * 50, "x", [5] * 60]}, 400,
     "prompt", "110 token ids; at most 100 per request"),
    ("/generate", {"input_ids": [5] * 65}, 400, "input_ids", "65 token ids"),
    ("/generate", {"input_ids": [[5], [5] * 65]}, 400, "input_ids[1]", "65 token ids"),
    ("/v1/embeddings", {"model": MODEL, "input": [5] * 65}, 400, "input", "65 token ids"),
    ("/detokenize", {"tokens": [5] * 101}, 400, "tokens", "101 token ids; at most 100"),
    # The prompt alone fills the context: its field, not max_tokens.
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 64, "max_tokens": 2}, 400,
     "prompt", "the prompt is 64 tokens; the model's context is 64"),
    ("/v1/completions", {"model": MODEL, "prompt": ["y", "x" * 64], "max_tokens": 2}, 400,
     "prompt[1]", "the prompt is 64 tokens"),
    ("/v1/chat/completions", _chat(messages=[{"role": "user", "content": "x" * 64}]), 400,
     "messages", "the model's context is 64"),
    ("/generate", {"text": "x" * 64}, 400, "text", "the prompt is 64 tokens"),
    ("/generate", {"text": ["y", "x" * 64]}, 400, "text[1]", "the prompt is 64 tokens"),
    # Far past the context: refused from the text's head (16 characters per context token).
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 2000}, 400,
     "prompt", "its first 1024 characters are 1024 tokens"),
    ("/v1/chat/completions", _chat(messages=[{"role": "user", "content": "x" * 2000}]), 400,
     "messages", "its first 1024 characters"),
    ("/generate", {"text": "x" * 2000}, 400, "text", "its first 1024 characters"),
    # Both together too long: max_tokens is to blame.
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 10, "max_tokens": 60}, 400,
     "max_tokens", "exceeds the context length (64)"),
    # Tool definitions count as prompt text, with the messages.
    ("/v1/chat/completions", _chat(tools=[_tool(0, "d" * 4100)]), 400,
     "tools", "more than 4096 bytes of prompt text"),
    # At the caps: routed (no worker here: 503).
    ("/tokenize", {"messages": [{"role": "user", "content": "a"}] * 8}, 200, None, ""),
    ("/v1/completions", {"model": MODEL, "prompt": [5] * 64, "max_tokens": 0}, 503, None, ""),
    ("/v1/completions", {"model": MODEL, "prompt": [[5] * 50, [5] * 50], "max_tokens": 2}, 503,
     None, ""),
    ("/generate", {"input_ids": [5] * 63, "sampling_params": {"max_new_tokens": 1}}, 503, None, ""),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "param", "message"), CASES)
def test_a_request_past_a_cap_is_refused_naming_its_field(
    front: Frontend, path: str, body: dict[str, Any], status: int, param: str | None, message: str
) -> None:
    resp = front.http.post(path, body)
    error = resp.json().get("error") or {"param": None, "message": ""}
    assert (resp.status_code, error["param"]) == (status, param), error
    assert message in error["message"], error


def test_counts_are_read_before_the_items_are_looked_at() -> None:
    """100k messages that are not even messages: the count is the answer, not their shape."""
    limits = RequestLimits(max_messages=4096)
    with pytest.raises(InvalidArgument, match="messages: 100000 messages; at most 4096"):
        limits.check_counts({"messages": [None] * 100_000})
    limits.check_counts({"messages": "not a list", "tools": {}, "prompt": 5})  # the parser's


def test_grpc_input_caps_name_the_input_field() -> None:
    tok = ByteTokenizer(256)
    chat = common_pb2.Input(
        messages=common_pb2.ChatMessages(
            messages=[common_pb2.ChatMessage(role="user", content="a")] * 9
        )
    )
    with pytest.raises(InvalidArgument, match=r"input\.messages: 9 messages; at most 8"):
        input_ids_from_proto(chat, tok, max_messages=8)
    ids = common_pb2.Input(token_ids=common_pb2.TokenIds(ids=[5] * 65))
    with pytest.raises(InvalidArgument, match=r"input\.token_ids: 65 token ids; at most 64"):
        input_ids_from_proto(ids, tok, max_token_ids=64)
    assert input_ids_from_proto(ids, tok, max_messages=8, max_token_ids=65) == [5] * 65


def test_validate_for_blames_the_prompt_when_it_alone_fills_the_context() -> None:
    with pytest.raises(InvalidArgument) as e:
        SamplingParams(max_new_tokens=1).validate_for(prompt_len=64, context_len=64, vocab_size=256)
    assert e.value.field == "prompt"
    with pytest.raises(InvalidArgument) as e:
        SamplingParams(max_new_tokens=60).validate_for(
            prompt_len=10, context_len=64, vocab_size=256
        )
    assert e.value.field == "max_new_tokens"
    SamplingParams(max_new_tokens=0).validate_for(prompt_len=64, context_len=64, vocab_size=256)


@pytest.mark.parametrize(
    ("value", "depth"),
    [
        ({"messages": [{"role": "user", "content": "hi"}] * 3}, 3),
        ({"a": 'x\\"[[[', "b": [[1]]}, 3),  # brackets in strings, escaped quotes
        ({"a": "\\\\", "b": "[", "c": [{}]}, 3),  # an escaped backslash before a quote
        ({"a": "\n[\u00e9{", "b": []}, 2),
        ([], 1),
        ("x", 0),
    ],
)
def test_json_depth_skips_strings(value: Any, depth: int) -> None:
    for ensure_ascii in (True, False):
        assert json_depth(json.dumps(value, ensure_ascii=ensure_ascii)) == depth
    assert json_depth("[" * 300 + "]" * 300) == 300
