"""`/v1/messages` and `/v1/responses` answering on their own, over HTTP without workers:
each API's error layout and statuses, fields named in its spelling, `x-api-key`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from radixmesh.tokenizer import ByteTokenizer
from tests.router.http.openai.frontend import Frontend
from tests.router.http_helpers import Http, Response

MODEL = "dummy:tiny"
MESSAGES = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": MODEL, "input": "hi", "max_output_tokens": 4}
KEY = "sk-test-key"


@pytest.fixture(scope="module")
def frontend() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), MODEL)
    yield f
    f.close()


@pytest.fixture(scope="module")
def keyed() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), MODEL, api_keys=(KEY,))
    yield f
    f.close()


def anthropic_error(resp: Response, status: int, kind: str) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    return str(body["error"]["message"])


def openai_error(resp: Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def messages(f: Frontend, **body: Any) -> Response:
    return f.http.post("/v1/messages", {**MESSAGES, **body})


def test_messages_errors_are_anthropic_shaped(frontend: Frontend) -> None:
    missing = {k: v for k, v in MESSAGES.items() if k != "max_tokens"}
    message = anthropic_error(
        frontend.http.post("/v1/messages", missing), 400, "invalid_request_error"
    )
    assert message.startswith("max_tokens: ")
    bad_role = messages(frontend, messages=[{"role": "robot", "content": "x"}])
    assert anthropic_error(bad_role, 400, "invalid_request_error").startswith("messages[0].role: ")
    bad_block = messages(frontend, messages=[{"role": "user", "content": [{"type": "audio"}]}])
    message = anthropic_error(bad_block, 400, "invalid_request_error")
    assert message.startswith("messages[0].content[0]: type must be one of text, image")
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    refused = messages(frontend, messages=[{"role": "user", "content": [image]}])
    assert "image blocks are not supported" in anthropic_error(
        refused, 400, "invalid_request_error"
    )
    wrong = messages(frontend, model="claude-opus-9")
    assert anthropic_error(wrong, 404, "not_found_error").startswith(
        "model: the model 'claude-opus-9'"
    )
    body = anthropic_error(frontend.http.post("/v1/messages", b"{"), 400, "invalid_request_error")
    assert "not valid JSON" in body
    # Valid and routed: no worker answers here (Anthropic's retryable "overloaded").
    anthropic_error(messages(frontend), 503, "overloaded_error")
    anthropic_error(frontend.http.get("/v1/messages"), 405, "invalid_request_error")


def test_count_tokens_answers_from_the_router(frontend: Frontend) -> None:
    body = {"model": MODEL, "system": "S", "messages": [{"role": "user", "content": "hi"}]}
    resp = frontend.http.post("/v1/messages/count_tokens", body)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"input_tokens": len("<|system|>\nS\n<|user|>\nhi\n<|assistant|>\n")}


def test_x_api_key_on_messages_only(keyed: Frontend) -> None:
    def post(path: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        http = Http(keyed.port)
        http.headers |= headers
        return http.post(path, body)

    message = anthropic_error(post("/v1/messages", MESSAGES, {}), 401, "authentication_error")
    assert "x-api-key" in message
    wrong = post("/v1/messages", MESSAGES, {"x-api-key": "sk-wrong"})
    anthropic_error(wrong, 401, "authentication_error")
    for headers in ({"x-api-key": KEY}, {"Authorization": f"Bearer {KEY}"}):
        anthropic_error(post("/v1/messages", MESSAGES, headers), 503, "overloaded_error")
    # The OpenAI routes keep OpenAI's header.
    error = openai_error(post("/v1/responses", RESPONSES, {"x-api-key": KEY}), 401)
    assert error["code"] == "invalid_api_key"
    assert openai_error(post("/v1/responses", RESPONSES, {"Authorization": f"Bearer {KEY}"}), 503)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "gpt-9"}, 404, "model"),
        ({"previous_response_id": "resp_unknown"}, 404, "previous_response_id"),
        ({"input": [{"type": "computer_call"}]}, 400, "input[0]"),
        ({"input": [{"role": "robot", "content": "x"}]}, 400, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            400,
            "input[0].content[0]",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
            400,
            "input[0].arguments",
        ),
        ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": 5}}]},
            400,
            "tools[0].parameters",
        ),
        ({"tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema"),
        ({"max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"max_output_tokens": 4000}, 400, "max_output_tokens"),
        ({"temperature": -1.0}, 400, "temperature"),
        ({"background": True}, 400, "background"),
        ({"input": []}, 400, "input"),
    ],
)
def test_responses_errors_name_their_field(
    frontend: Frontend, body: dict[str, Any], status: int, param: str
) -> None:
    error = openai_error(frontend.http.post("/v1/responses", {**RESPONSES, **body}), status)
    assert error["param"] == param, error
    if param == "previous_response_id":
        assert error["code"] == "previous_response_not_found"
        assert "resp_unknown" in error["message"]


def test_input_items_are_not_token_ids(frontend: Frontend) -> None:
    """A list of items in `input` is counted as messages, not read as token ids (the
    embeddings and completions meaning of `input`) against the context."""
    items = [{"role": "user", "content": "hi"}] * 3000  # more items than context tokens
    error = openai_error(frontend.http.post("/v1/responses", {**RESPONSES, "input": items}), 400)
    assert error["param"] == "input"
    assert error["message"].startswith("the prompt is longer than the context")


def test_responses_valid_requests_reach_routing(frontend: Frontend) -> None:
    items = [
        {"role": "developer", "content": "Be terse."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": json.dumps({"a": 1})},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "reasoning", "summary": []},
    ]
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    body = {**RESPONSES, "input": items, "tools": tools, "instructions": "I", "store": False}
    assert openai_error(frontend.http.post("/v1/responses", body), 503)["code"] == "unavailable"


@pytest.fixture(scope="module")
def capped() -> Iterator[Frontend]:
    f = Frontend(
        ByteTokenizer(256, eos_token_ids=[0]), MODEL, max_prompt_bytes=1000, max_messages=4
    )
    yield f
    f.close()


def test_the_request_caps_cover_the_new_fields(capped: Frontend) -> None:
    long = "x" * 1500
    message = anthropic_error(messages(capped, system=long), 400, "invalid_request_error")
    assert message.startswith("system: more than 1000 bytes of prompt text")
    error = openai_error(
        capped.http.post("/v1/responses", {**RESPONSES, "instructions": long}), 400
    )
    assert error["param"] == "instructions"
    five = [{"role": "user", "content": "hi"}] * 5
    message = anthropic_error(messages(capped, messages=five), 400, "invalid_request_error")
    assert message.startswith("messages: 5 messages; at most 4")
    error = openai_error(capped.http.post("/v1/responses", {**RESPONSES, "input": five}), 400)
    assert (error["param"], error["message"]) == ("input", "5 items; at most 4 per request")
