"""Every sampling field, sent with values of the wrong type or out of range, gets a 400
naming that field, never a 500: SGLang's `POST /generate` (`sampling_params.<name>`) and
OpenAI's completions and chat (the field itself).

The router's real HTTP front end on loopback, without workers (tests/router/http/openai/
frontend.py): a request that passed validation would be routed and get 503, so a 400 here
is the validation's answer. Bodies are sent as raw JSON text so that `1e400` arrives as the
number a client can write (Python's parser reads it as infinity).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from radixmesh.tokenizer import ByteTokenizer
from tests.router.http.openai.frontend import Frontend

MODEL = "dummy:tiny"

# Raw JSON values, by what the field takes; each is wrong for every field of its kind
# (null is "not given" in both APIs, so it is none of them; -2 is below every int field's
# range: top_k's is -1 and up, the others' 0 and up).
_NOT_A_NUMBER = ["[]", "{}", '"x"', "true", "[1]", '{"a": 1}', "1e400"]
WRONG = {
    "int": [*_NOT_A_NUMBER, "2.5", str(2**70), "-2"],
    "float": _NOT_A_NUMBER,
    "bool": ["[]", "{}", '"x"', "1e400", "-1", "1", '"true"'],
    "text": ["[]", "1e400", "-1", "true", '{"a": 1}'],
    "stop": ["{}", "1e400", "-1", "true", "[1]", '[""]', "[[]]"],
    "ids": ["{}", '"x"', "1e400", "-1", "true", '["a"]', "[-1]", "[true]", "[1.5]"],
}
SGLANG_FIELDS = {
    "max_new_tokens": "int",
    "min_new_tokens": "int",
    "top_k": "int",
    "n": "int",
    "sampling_seed": "int",
    "temperature": "float",
    "top_p": "float",
    "min_p": "float",
    "frequency_penalty": "float",
    "presence_penalty": "float",
    "repetition_penalty": "float",
    "ignore_eos": "bool",
    "skip_special_tokens": "bool",
    "no_stop_trim": "bool",
    "regex": "text",
    "ebnf": "text",
    "stop": "stop",
    "stop_token_ids": "ids",
}
OPENAI_FIELDS = {
    "max_tokens": "int",
    "max_completion_tokens": "int",
    "min_tokens": "int",
    "top_k": "int",
    "n": "int",
    "seed": "int",
    "temperature": "float",
    "top_p": "float",
    "min_p": "float",
    "frequency_penalty": "float",
    "presence_penalty": "float",
    "repetition_penalty": "float",
    "ignore_eos": "bool",
    "skip_special_tokens": "bool",
    "stream": "bool",
    "regex": "text",
    "ebnf": "text",
    "stop": "stop",
    "stop_token_ids": "ids",
}


def _cases(fields: dict[str, str]) -> list[tuple[str, str]]:
    return [(name, value) for name, kind in fields.items() for value in WRONG[kind]]


@pytest.fixture(scope="module")
def front() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), MODEL)
    yield f
    f.close()


def _post(front: Frontend, path: str, raw: str) -> tuple[int, dict[str, Any]]:
    resp = front.http.request("POST", path, raw.encode())
    body = resp.json()  # every answer is JSON, a 500 included
    return resp.status_code, body


def _assert_names(status: int, body: dict[str, Any], field: str, raw: str) -> None:
    assert status == 400, (field, raw, status, body)
    param = body["error"]["param"]
    assert param is not None and param.split("[")[0] == field, (field, raw, body)
    assert body["error"]["code"] == "invalid_argument" and body["error"]["message"]


@pytest.mark.parametrize(("name", "raw"), _cases(SGLANG_FIELDS))
def test_generate_names_a_wrongly_typed_sampling_field(
    front: Frontend, name: str, raw: str
) -> None:
    max_tokens = "" if name == "max_new_tokens" else '"max_new_tokens": 2, '
    body = f'{{"text": "hi", "sampling_params": {{{max_tokens}"{name}": {raw}}}}}'
    status, reply = _post(front, "/generate", body)
    _assert_names(status, reply, f"sampling_params.{name}", raw)


@pytest.mark.parametrize("raw", ['"x"', "[]", "{}", "true", "-1", "1e400", str(2**70)])
def test_generate_seed_with_n_is_checked_before_it_is_offset(front: Frontend, raw: str) -> None:
    """n samples of one seed get seed, seed + 1, ...: the seed is checked before the sum."""
    body = f'{{"text": "hi", "sampling_params": {{"n": 2, "sampling_seed": {raw}}}}}'
    status, reply = _post(front, "/generate", body)
    _assert_names(status, reply, "sampling_params.sampling_seed", raw)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize(("name", "raw"), _cases(OPENAI_FIELDS))
def test_openai_names_a_wrongly_typed_sampling_field(
    front: Frontend, chat: bool, name: str, raw: str
) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    prompt = '"messages": [{"role": "user", "content": "hi"}]' if chat else '"prompt": "hi"'
    max_tokens = "" if "max_" in name else '"max_tokens": 2, '
    body = f'{{"model": "{MODEL}", {prompt}, {max_tokens}"{name}": {raw}}}'
    status, reply = _post(front, path, body)
    _assert_names(status, reply, name, raw)


def test_valid_values_pass_validation(front: Frontend) -> None:
    """The counter-check: right values are routed (503: no worker here), not refused."""
    params = {"max_new_tokens": 2, "n": 2, "sampling_seed": 7, "top_k": -1, "stop": ["x"]}
    status, reply = _post(front, "/generate", json.dumps({"text": "hi", "sampling_params": params}))
    assert status == 503, reply
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "seed": 7, "frequency_penalty": -1}
    status, reply = _post(front, "/v1/completions", json.dumps(body))
    assert status == 503, reply
