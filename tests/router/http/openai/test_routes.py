"""The OpenAI routes' own answers, over HTTP without workers: errors in OpenAI's layout,
unknown fields refused (the default) or, with --no-strict-openai, ignored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from radixmesh.tokenizer import ByteTokenizer
from tests.router.http.openai.frontend import Frontend
from tests.router.http_helpers import Response

MODEL = "dummy:tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def lenient() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), MODEL, strict_openai=False)
    yield f
    f.close()


@pytest.fixture(scope="module")
def strict() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), MODEL)
    yield f
    f.close()


def error(resp: Response, status: int) -> dict[str, str | None]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_unknown_fields_pass_validation_unless_strict(lenient: Frontend, strict: Frontend) -> None:
    body = {**CHAT, "frobnicate": 1, "user": "someone"}
    # Valid and routed: no worker answers here, so the router says 503.
    assert error(lenient.http.post("/v1/chat/completions", body), 503)["code"] == "unavailable"
    err = error(strict.http.post("/v1/chat/completions", body), 400)
    assert (err["param"], err["type"]) == ("frobnicate", "invalid_request_error")
    assert error(strict.http.post("/v1/chat/completions", CHAT), 503)["code"] == "unavailable"


def test_bad_fields_are_400_naming_them(lenient: Frontend) -> None:
    bad = {**CHAT, "messages": [{"role": "tool", "content": "42"}]}
    err = error(lenient.http.post("/v1/chat/completions", bad), 400)
    assert (err["param"], err["code"]) == ("messages[0].tool_call_id", "invalid_argument")
    err = error(lenient.http.post("/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}), 400)
    assert err["param"] == "n"
    assert error(lenient.http.post("/v1/completions", b"[1, 2"), 400)["code"] == "invalid_json"
    err = error(lenient.http.post("/v1/completions", {"model": "gpt-9", "prompt": "x"}), 404)
    assert (err["param"], err["code"]) == ("model", "model_not_found")


def test_chat_template_kwargs_are_a_known_field_checked_by_name(strict: Frontend) -> None:
    thinking_off = {**CHAT, "chat_template_kwargs": {"enable_thinking": False}}
    assert error(strict.http.post("/v1/chat/completions", thinking_off), 503)["code"] == (
        "unavailable"  # valid, even under strict field checks; no worker answers here
    )
    reserved = {**CHAT, "chat_template_kwargs": {"tokenize": True}}
    err = error(strict.http.post("/v1/chat/completions", reserved), 400)
    assert (err["param"], err["code"]) == ("chat_template_kwargs", "invalid_argument")
    not_an_object = {**CHAT, "chat_template_kwargs": [1]}
    err = error(strict.http.post("/v1/chat/completions", not_an_object), 400)
    assert err["param"] == "chat_template_kwargs"
    tokenize = {"model": MODEL, "messages": CHAT["messages"], "chat_template_kwargs": {"x": 1}}
    assert strict.http.post("/tokenize", tokenize).status_code == 200
