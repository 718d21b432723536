"""The router's OpenAI-compatible HTTP API over real worker processes.

A two-worker dummy:tiny cluster (float32, byte tokenizer: a prompt's tokens are its UTF-8
bytes) serves the format, streaming, cache and error tests; its HTTP answers are checked
against the router's own gRPC answers. A one-worker smollm2 cluster that admits a single
request serves the real-text test through the `openai` client, 429, a client disconnect
that must free the worker's only slot, and finally 503 after the worker is killed.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc
from tests.router.http_helpers import Http, Response

pytestmark = pytest.mark.slow

MODEL = "dummy:tiny"
WORKER_ARGS = ("--dtype", "float32", "--event-block-size", "16")


class HttpCluster:
    def __init__(self, cluster: LocalCluster, http_port: int) -> None:
        self.cluster = cluster
        self.url = f"http://127.0.0.1:{http_port}"
        self.http = Http(http_port)

    def post(self, path: str, body: dict[str, Any]) -> Response:
        return self.http.post(path, body)

    def grpc_text(self, text: str, max_new_tokens: int) -> common_pb2.GenerateChunk:
        with grpc.insecure_channel(self.cluster.address) as ch:
            req = router_pb2.RouterGenerateRequest(
                input=common_pb2.Input(text=text),
                sampling_params=common_pb2.SamplingParams(
                    max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True
                ),
            )
            (resp,) = list(router_pb2_grpc.RouterStub(ch).Generate(req, timeout=60))
        return resp.chunk


def _start(model: str, workers: int, worker_args: tuple[str, ...]) -> Iterator[HttpCluster]:
    http_port = free_port()
    config = LaunchSpec(
        model=model,
        workers=workers,
        port=free_port(),
        worker_args=worker_args,
        router_options={"http_port": http_port, "seed": 0, "health_interval": 0.2},
        ready_timeout=240.0,
    )
    with LocalCluster(config) as cluster:
        yield HttpCluster(cluster, http_port)


@pytest.fixture(scope="module")
def tiny() -> Iterator[HttpCluster]:
    yield from _start(MODEL, 2, WORKER_ARGS)


def _sse(text: str) -> list[Any]:
    """An SSE body's `data:` payloads (JSON decoded, `[DONE]` kept as the string); a
    resumable stream's events have an `id:` line after it."""
    events = [e.split("\n")[0] for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    return [e[6:] if e == "data: [DONE]" else json.loads(e[6:]) for e in events]


def _error(resp: Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


# ---- formats ----------------------------------------------------------------------------------


def test_models_and_health(tiny: HttpCluster) -> None:
    models = tiny.http.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == 2048
    assert tiny.http.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert tiny.http.get("/health").json() == {"status": "ok", "healthy_workers": 2}


def test_completion_equals_the_grpc_answer(tiny: HttpCluster) -> None:
    prompt = "completion test: the router answers HTTP and gRPC alike"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0}
    resp = tiny.post("/v1/completions", {**body, "ignore_eos": True}).json()
    expected = tiny.grpc_text(prompt, 5)
    assert resp["object"] == "text_completion"
    assert resp["id"].startswith("cmpl-")
    (choice,) = resp["choices"]
    assert choice == {
        "index": 0,
        "text": expected.text,
        "logprobs": None,
        "finish_reason": "length",
    }
    n = len(prompt.encode())
    assert resp["usage"]["prompt_tokens"] == n
    assert resp["usage"]["completion_tokens"] == 5
    assert resp["usage"]["total_tokens"] == n + 5
    # The same prompt as token ids gives the same text.
    ids = list(prompt.encode())
    again = tiny.post("/v1/completions", {**body, "prompt": ids, "ignore_eos": True}).json()
    assert again["choices"][0]["text"] == expected.text


def test_repeated_prompt_reports_cached_tokens(tiny: HttpCluster) -> None:
    prompt = "A shared prefix that the radix cache keeps between requests. " * 3
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    first = tiny.post("/v1/completions", body).json()["usage"]
    over_grpc = tiny.grpc_text(prompt, 2)  # the same worker, the same cache match
    second = tiny.post("/v1/completions", body).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert over_grpc.cached_tokens > 150
    assert second["prompt_tokens_details"]["cached_tokens"] == over_grpc.cached_tokens
    assert second["prompt_tokens"] == len(prompt.encode())


def test_streamed_completion_with_usage(tiny: HttpCluster) -> None:
    prompt = "stream me some bytes"
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    resp = tiny.post("/v1/completions", body)
    assert resp.headers["content-type"] == "text/event-stream"
    events = _sse(resp.text)
    assert events[-1] == "[DONE]"
    usage_event = events[-2]
    assert usage_event["choices"] == []
    assert usage_event["usage"]["completion_tokens"] == 6
    assert usage_event["usage"]["prompt_tokens"] == len(prompt.encode())
    chunks = events[:-2]
    assert all(e["usage"] is None for e in chunks)
    assert "".join(e["choices"][0]["text"] for e in chunks) == tiny.grpc_text(prompt, 6).text
    assert [e["choices"][0]["finish_reason"] for e in chunks][-1] == "length"


def test_streamed_choices_interleave_and_each_finishes(tiny: HttpCluster) -> None:
    body = {"model": MODEL, "prompt": ["one", "two"], "max_tokens": 3, "temperature": 0}
    body["ignore_eos"] = True
    whole = tiny.post("/v1/completions", body).json()["choices"]
    events = _sse(tiny.post("/v1/completions", {**body, "stream": True}).text)
    assert events[-1] == "[DONE]"
    texts = {0: "", 1: ""}
    finished = []
    for e in events[:-1]:
        (choice,) = e["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"] is not None:
            finished.append(choice["index"])
    assert sorted(finished) == [0, 1]
    assert [texts[0], texts[1]] == [c["text"] for c in whole]


def test_chat_through_the_openai_client(tiny: HttpCluster) -> None:
    client = openai.OpenAI(base_url=tiny.url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "hello"}]
    done = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0, seed=1
    )
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].finish_reason == "length"
    assert done.usage is not None and done.usage.completion_tokens == 4
    # The byte tokenizer's chat template: "<|user|>\nhello\n<|assistant|>\n".
    assert done.usage.prompt_tokens == len(b"<|user|>\nhello\n<|assistant|>\n")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == done.usage.total_tokens
    # n choices, and a batch of two prompts: indexes prompt * n + choice.
    many = client.completions.create(
        model=MODEL, prompt=["ab", "cd"], n=2, max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.usage is not None and many.usage.completion_tokens == 8
    assert many.usage.prompt_tokens == 4


def test_ignored_fields_do_not_change_the_answer_and_unknown_ones_are_refused(
    tiny: HttpCluster,
) -> None:
    client = openai.OpenAI(base_url=tiny.url + "/v1", api_key="unused", max_retries=0)
    args: Any = {"model": MODEL, "prompt": "same answer", "max_tokens": 4, "temperature": 0}
    plain = client.completions.create(**args)
    extra = client.completions.create(
        **args, user="someone", extra_body={"metadata": {"k": "v"}, "prompt_cache_key": "k"}
    )
    assert extra.choices[0].text == plain.choices[0].text
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**args, extra_body={"frobnicate": 1})
    assert e.value.param == "frobnicate"


def test_logprobs(tiny: HttpCluster) -> None:
    body = {"model": MODEL, "prompt": "logprobs", "max_tokens": 3, "temperature": 0}
    lp = tiny.post("/v1/completions", {**body, "logprobs": 2}).json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    # A dict per position, keyed by token text (ids that decode alike share a key).
    assert all(1 <= len(t) <= 2 for t in lp["top_logprobs"])
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    body = {**chat, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    content = tiny.post("/v1/chat/completions", body).json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 2
    for entry in content:
        assert len(entry["top_logprobs"]) == 2
        # Greedy: the chosen token is the most likely one.
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"])
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]


def test_json_schema_response_format_is_followed(tiny: HttpCluster) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "json please"}],
        "max_tokens": 40,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    out = tiny.post("/v1/chat/completions", body).json()
    assert out["choices"][0]["finish_reason"] == "stop"
    assert set(json.loads(out["choices"][0]["message"]["content"])) == {"ok"}


# ---- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 2}, "top_p"),
        ({"max_tokens": 100_000}, "max_tokens"),  # the worker's check, passed through
        ({"n": 0}, "n"),
        ({"logprobs": 99}, "logprobs"),
        ({"prompt": []}, "prompt"),
        ({"model": None}, "model"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
        ({"echo": True, "logprobs": 1, "stream": True}, "echo"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"512": 1}}, "logit_bias"),  # outside the vocabulary: the worker check
    ],
)
def test_invalid_fields_are_400_naming_the_param(
    tiny: HttpCluster, body: dict[str, Any], param: str
) -> None:
    base = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    err = _error(tiny.post("/v1/completions", {**base, **body}), 400)
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"


def test_chat_errors(tiny: HttpCluster) -> None:
    base = {"model": MODEL, "max_tokens": 2}
    bad_role = {**base, "messages": [{"role": "wizard", "content": "x"}]}
    assert _error(tiny.post("/v1/chat/completions", bad_role), 400)["param"] == "messages[0]"
    bad_format = {**base, "messages": [{"role": "user", "content": "x"}]}
    bad_format["response_format"] = {"type": "yaml"}
    err = _error(tiny.post("/v1/chat/completions", bad_format), 400)
    assert err["param"] == "response_format.type"
    resp = tiny.http.post("/v1/chat/completions", b"{not json")
    assert _error(resp, 400)["code"] == "invalid_json"


def test_unknown_model_and_route_are_404(tiny: HttpCluster) -> None:
    err = _error(tiny.post("/v1/completions", {"model": "gpt-9", "prompt": "x"}), 404)
    assert (err["param"], err["code"]) == ("model", "model_not_found")
    assert _error(tiny.http.get("/v1/models/gpt-9"), 404)["code"] == "model_not_found"
    assert _error(tiny.http.get("/v1/engines"), 404)["code"] == "not_found"


# ---- the bundled model: real text, 429, disconnects, 503 --------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> Iterator[HttpCluster]:
    # One request at a time: a second one is refused with RESOURCE_EXHAUSTED.
    args = ("--dtype", "float32", "--max-running-requests", "1", "--max-queued-requests", "0")
    yield from _start("smollm2", 1, args)


QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France? Answer in one word."}
]
LONG = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "Count to a thousand."}],
    "max_tokens": 1000,
    "ignore_eos": True,
    "stream": True,
}


def test_openai_client_gets_paris(smollm2: HttpCluster) -> None:
    client = openai.OpenAI(base_url=smollm2.url + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model="smollm2",
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
    )
    assert out.choices[0].message.content is not None
    assert "Paris" in out.choices[0].message.content
    assert out.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model="smollm2",
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == out.choices[0].message.content


def _running(h: HttpCluster) -> int:
    with grpc.insecure_channel(h.cluster.address) as ch:
        resp = router_pb2_grpc.RouterStub(ch).ClusterStatus(router_pb2.ClusterStatusRequest())
    return sum(w.num_running + w.num_waiting for w in resp.workers)


def _wait_idle(h: HttpCluster, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _running(h) != 0:
        assert time.monotonic() < deadline, "the worker still runs the request"
        time.sleep(0.1)


def test_second_request_is_429_while_the_only_slot_is_busy(smollm2: HttpCluster) -> None:
    conn, first = smollm2.http.open_stream("/v1/chat/completions", LONG)
    try:
        assert first.status == 200
        assert first.readline().startswith(b"data: ")  # the first one is generating
        body = {"model": "smollm2", "prompt": "hi", "max_tokens": 2}
        err = _error(smollm2.post("/v1/completions", body), 429)
        assert (err["type"], err["code"]) == ("rate_limit_error", "resource_exhausted")
    finally:
        conn.close()
    _wait_idle(smollm2)


def test_client_disconnect_aborts_the_worker_request(smollm2: HttpCluster) -> None:
    for _ in range(2):  # twice: a leaked slot would turn the second request into a 429
        conn, resp = smollm2.http.open_stream("/v1/chat/completions", LONG)
        assert resp.status == 200
        for _ in range(6):  # three events (a blank line after each)
            resp.readline()
        conn.close()  # mid-stream: the worker must drop the request
        _wait_idle(smollm2)
    body = {"model": "smollm2", "prompt": "hi", "max_tokens": 2}
    assert smollm2.post("/v1/completions", body).status_code == 200


def test_no_healthy_worker_is_503(smollm2: HttpCluster) -> None:
    """Last in the module: it kills the worker, mid-stream."""
    conn, stream = smollm2.http.open_stream("/v1/chat/completions", LONG)
    assert stream.status == 200
    assert stream.readline().startswith(b"data: ")
    worker = smollm2.cluster.workers[0]
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    # The started stream ends with an error event, then [DONE].
    events = _sse(stream.read().decode().lstrip("\n"))
    conn.close()
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "unavailable"
    body = {"model": "smollm2", "prompt": "hi", "max_tokens": 2}
    err = _error(smollm2.post("/v1/completions", body), 503)
    assert (err["type"], err["code"]) == ("service_unavailable_error", "unavailable")
    deadline = time.monotonic() + 10
    while smollm2.http.get("/health").status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.1)
