"""POST /tokenize and /detokenize with the bundled model's tokenizer, over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from radixmesh.tokenizer import Tokenizer
from radixmesh.worker.model.loader import load_tokenizer
from tests.router.http.openai.frontend import Frontend

MODEL = "smollm2"


@pytest.fixture(scope="module")
def tok(smollm2_gguf: Path) -> Tokenizer:
    t = load_tokenizer(MODEL)
    assert isinstance(t, Tokenizer)
    return t


@pytest.fixture(scope="module")
def frontend(tok: Tokenizer) -> Iterator[Frontend]:
    f = Frontend(tok, MODEL, context_length=8192)
    yield f
    f.close()


def test_round_trip(frontend: Frontend, tok: Tokenizer) -> None:
    text = "Tokenizers split text: «naïve» café, 2 + 2 = 4.\n<|im_end|>"
    out = frontend.http.post("/tokenize", {"model": MODEL, "prompt": text}).json()
    assert out["tokens"] == tok.encode(text)
    assert out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 8192
    assert tok.hf_tokenizer.convert_tokens_to_ids("<|im_end|>") == out["tokens"][-1]
    back = frontend.http.post("/detokenize", {"model": MODEL, "tokens": out["tokens"]}).json()
    assert back == {"prompt": text}
    skipped = {"tokens": out["tokens"], "skip_special_tokens": True}
    assert frontend.http.post("/detokenize", skipped).json()["prompt"] == text[: -len("<|im_end|>")]


def test_messages_are_tokenized_like_a_chat_request(frontend: Frontend, tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    out = frontend.http.post("/tokenize", {"messages": messages, "return_token_strs": True})
    body = out.json()
    assert body["tokens"] == tok.encode_chat(messages)
    assert body["token_strs"] == tok.convert_ids_to_tokens(body["tokens"])
    no_prompt = {"messages": messages, "add_generation_prompt": False}
    assert frontend.http.post("/tokenize", no_prompt).json()["tokens"] == tok.encode_chat(
        messages, add_generation_prompt=False
    )


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/detokenize", {"tokens": [1, 49152]}, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/detokenize", {"model": "other", "tokens": [1]}, "model"),
    ],
)
def test_bad_requests_name_the_field(
    frontend: Frontend, path: str, body: dict[str, object], param: str
) -> None:
    resp = frontend.http.post(path, body)
    assert resp.status_code in (400, 404), resp.text
    assert resp.json()["error"]["param"] == param
