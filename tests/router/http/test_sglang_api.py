"""SGLang's native HTTP API on the router, over a 2-worker smollm2 cluster (float32,
deterministic mode).

`/generate` field by field (checked against the router's gRPC answers), the other
endpoints, bad input, and finally the real `sglang` package's RuntimeEndpoint running
SGLang programs against the router (in a subprocess: see tests/router/sglang_client.py).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import radixmesh as sgl
from radixmesh.client import Client
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from tests.router.http_helpers import Http, Response

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
SGLANG_SITE = Path(os.environ.get("RADIXMESH_SGLANG_SITE", ROOT / ".sglang-site"))
PROMPT = "The capital of France is"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# What SGLang's frontend alone is given: the hub id and the note its template patterns read
# (model_identity.py).
SGLANG_MODEL_PATH = f"{SMOLLM2_HUB_ID} (chat template: chatml, as TinyLlama's)"


class Cluster:
    def __init__(self, cluster: LocalCluster, http_port: int) -> None:
        self.cluster = cluster
        self.url = f"http://127.0.0.1:{http_port}"
        self.http = Http(http_port)

    def generate(self, body: dict[str, Any], status: int = 200) -> Any:
        resp = self.http.post("/generate", body)
        assert resp.status_code == status, resp.text
        return resp.json()

    def grpc(self, prompt: str, **params: Any) -> Any:
        with Client(self.cluster.address) as client:
            return client.generate(prompt, {"temperature": 0.0, **params})


@pytest.fixture(scope="module")
def cluster(smollm2_gguf: object) -> Iterator[Cluster]:
    http_port = free_port()
    config = LaunchSpec(
        model="smollm2",
        workers=2,
        port=free_port(),
        # Deterministic workers: a near tie (greedy_token_selection's below) is decided the
        # same way whichever batch, cache state or worker a request meets.
        worker_args=("--dtype", "float32", "--kv-cache-tokens", "8192", "--deterministic"),
        router_options={"http_port": http_port, "seed": 0, "health_interval": 0.2},
        ready_timeout=240.0,
    )
    with LocalCluster(config) as c:
        yield Cluster(c, http_port)


def error(resp: Response, status: int, param: str) -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["param"] == param, err
    return str(err["message"])


def sse(text: str) -> list[Any]:
    """The events' data; a resumable stream's events have an `id:` line after it."""
    events = [e.split("\n")[0] for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[6:]) for e in events[:-1]]


# ---- /generate ---------------------------------------------------------------------------


def test_one_text_equals_the_grpc_answer(cluster: Cluster) -> None:
    out = cluster.generate(
        {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    )
    expected = cluster.grpc(PROMPT, max_new_tokens=8)
    assert out["text"] == expected.text and out["output_ids"] == expected.token_ids
    meta = out["meta_info"]
    assert set(meta) == {
        "id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
        "e2e_latency", "worker_id",
    }  # fmt: skip
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (5, 8)
    assert meta["worker_id"] in ("worker-0", "worker-1")
    ids = cluster.generate(
        {
            "input_ids": expected_ids(cluster),
            "sampling_params": {"max_new_tokens": 8, "temperature": 0},
        }
    )
    assert ids["text"] == out["text"]  # the same prompt as token ids


def expected_ids(cluster: Cluster) -> list[int]:
    tok = sgl.RuntimeEndpoint(cluster.cluster.address).tokenizer
    return list(tok.encode(PROMPT))


def test_batches_and_n(cluster: Cluster) -> None:
    greedy = {"max_new_tokens": 4, "temperature": 0}
    outs = cluster.generate({"text": [PROMPT, "1, 2, 3,"], "sampling_params": greedy})
    assert [o["index"] for o in outs] == [0, 1]
    assert outs[0]["text"] == cluster.grpc(PROMPT, max_new_tokens=4).text
    assert outs[1]["text"] == cluster.grpc("1, 2, 3,", max_new_tokens=4).text
    per_prompt = [{"max_new_tokens": 2, "temperature": 0}, {"max_new_tokens": 3, "temperature": 0}]
    outs = cluster.generate({"text": [PROMPT, PROMPT], "sampling_params": per_prompt})
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [2, 3]
    seeded = {"max_new_tokens": 6, "temperature": 1.0, "n": 3, "sampling_seed": 7}
    outs = cluster.generate({"text": PROMPT, "sampling_params": seeded})
    assert [o["index"] for o in outs] == [0, 1, 2]  # one prompt, n outputs: a list
    again = cluster.generate({"text": PROMPT, "sampling_params": seeded})
    assert [o["text"] for o in outs] == [o["text"] for o in again]  # seed + index
    assert len({o["text"] for o in outs}) > 1


def test_sampling_params_by_name(cluster: Cluster) -> None:
    def gen(**params: Any) -> dict[str, Any]:
        body = {"text": PROMPT, "sampling_params": {"temperature": 0, **params}}
        return dict(cluster.generate(body))

    stopped = gen(max_new_tokens=16, stop=["."], no_stop_trim=False)
    assert stopped["text"] == " Paris"
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": "."}
    assert gen(max_new_tokens=16, stop=".", no_stop_trim=True)["text"] == " Paris."
    assert re.fullmatch(r" [0-9]{3}", gen(max_new_tokens=8, regex=r" [0-9]{3}")["text"])
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    obj = json.loads(gen(max_new_tokens=16, json_schema=schema)["text"])
    assert isinstance(obj["x"], int)
    assert gen(max_new_tokens=4, ebnf='root ::= " yes" | " no"')["text"] in (" yes", " no")
    paris_id = cluster.grpc(PROMPT, max_new_tokens=1).token_ids[0]
    ended = gen(max_new_tokens=8, stop_token_ids=[paris_id])
    assert ended["meta_info"]["finish_reason"] == {"type": "stop", "matched": paris_id}
    long = gen(max_new_tokens=40, min_new_tokens=40, spaces_between_special_tokens=True)
    assert long["meta_info"]["completion_tokens"] == 40


def test_logprobs(cluster: Cluster) -> None:
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 3, "temperature": 0},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
        "logprob_start_len": 0,
    }
    meta = cluster.generate(body)["meta_info"]
    out = meta["output_token_logprobs"]
    assert len(out) == 3 and all(lp < 0 and isinstance(t, str) for lp, _, t in out)
    assert [len(top) for top in meta["output_top_logprobs"]] == [2, 2, 2]
    assert meta["output_top_logprobs"][0][0][1] == out[0][1]  # greedy: the top one
    inp = meta["input_token_logprobs"]
    assert len(inp) == 5 and inp[0][0] is None and all(e[0] < 0 for e in inp[1:])
    assert "".join(e[2] for e in inp) == PROMPT
    # Prefill only (max_new_tokens 0, as SGLang's select sends): no output, the prompt
    # scored from the start when no logprob_start_len is given.
    score = {"text": PROMPT, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True}
    scored = cluster.generate(score)
    assert (scored["text"], scored["output_ids"]) == ("", [])
    assert scored["meta_info"]["completion_tokens"] == 0
    assert [e[1] for e in scored["meta_info"]["input_token_logprobs"]] == [e[1] for e in inp]
    plain = cluster.generate({**body, "return_logprob": False})["meta_info"]
    assert "output_token_logprobs" not in plain


def test_streaming(cluster: Cluster) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    events = sse(cluster.http.post("/generate", {**body, "stream": True}).text)
    assert len(events) > 1
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))  # the text so far
    assert texts[-1] == cluster.generate(body)["text"]
    assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    batch = {**body, "text": [PROMPT, "1, 2,"], "stream": True}
    events = sse(cluster.http.post("/generate", batch).text)
    assert {e["index"] for e in events} == {0, 1}


# ---- the other endpoints and bad input ---------------------------------------------------


def test_info_flush_and_health(cluster: Cluster) -> None:
    info = cluster.http.get("/get_model_info").json()
    assert info["model_path"] == SMOLLM2_HUB_ID and info["is_generation"] is True
    assert (info["served_model_name"], info["chat_template"]) == ("smollm2", "chatml")
    assert info["tokenizer_path"] == SMOLLM2_HUB_ID
    models = cluster.http.get("/v1/models").json()["data"]
    assert [(m["id"], m["root"]) for m in models] == [("smollm2", SMOLLM2_HUB_ID)]
    assert cluster.http.get("/model_info").json() == info
    server = cluster.http.get("/get_server_info").json()
    assert server["grpc_port"] == int(cluster.cluster.address.rsplit(":", 1)[1])
    assert {w["worker_id"] for w in server["internal_states"]} == {"worker-0", "worker-1"}
    cluster.generate({"text": PROMPT * 4, "sampling_params": {"max_new_tokens": 1}})
    flushed = cluster.http.post("/flush_cache", b"")
    assert flushed.status_code == 200 and flushed.text == "Cache flushed on 2 workers.\n"
    again = cluster.generate({"text": PROMPT * 4, "sampling_params": {"max_new_tokens": 1}})
    assert again["meta_info"]["cached_tokens"] == 0
    assert cluster.http.get("/health").status_code == 200
    assert cluster.http.get("/health_generate").status_code == 200


def test_bad_input_names_the_field(cluster: Cluster) -> None:
    post = cluster.http.post
    assert "unknown field 'foo'" in error(post("/generate", {"text": "x", "foo": 1}), 400, "foo")
    bad: dict[str, Any] = {"text": "x", "sampling_params": {"temprature": 0}}
    error(post("/generate", bad), 400, "sampling_params.temprature")
    bad = {"text": "x", "sampling_params": {"temperature": -1}}
    error(post("/generate", bad), 400, "sampling_params.temperature")
    error(post("/generate", {"text": "x", "image_data": "cat.png"}), 400, "image_data")
    bad = {"text": "x", "sampling_params": {"stop_regex": "("}}  # not a regular expression
    error(post("/generate", bad), 400, "sampling_params.stop_regex")
    error(post("/generate", {"text": "x", "input_ids": [1]}), 400, "text")
    error(post("/generate", {"input_ids": [[1], "x"]}), 400, "input_ids")
    error(post("/generate", {"text": "x", "sampling_params": {"n": 99}}), 400, "sampling_params.n")
    error(post("/generate", b"{not json"), 400, None)  # type: ignore[arg-type]
    bad = {"text": "x", "return_logprob": True, "logprob_start_len": 5}
    error(post("/generate", bad), 400, "logprob_start_len")
    big = {"text": "x", "sampling_params": {"max_new_tokens": 10**6}}
    error(post("/generate", big), 400, "sampling_params.max_new_tokens")
    # SGLang's bookkeeping fields are accepted and change nothing. One new token: the default
    # (128) took more than the client's 60 s beside two busy loops.
    fine = {
        "text": PROMPT,
        "log_metrics": False,
        "image_data": None,
        "sampling_params": {"max_new_tokens": 1},
    }
    assert cluster.generate(fine)["meta_info"]["prompt_tokens"] == 5


def test_program_field_keeps_a_batch_on_one_worker(cluster: Cluster) -> None:
    shared = "A long shared instruction that every request of this batch starts with. " * 2
    body = {
        "text": [shared + f"Item {i}:" for i in range(8)],
        "sampling_params": {"max_new_tokens": 2, "temperature": 0},
        "program": {"program_id": "batch-42", "shared_prefix_tokens": 30},
    }
    outs = cluster.generate(body)
    assert len({o["meta_info"]["worker_id"] for o in outs}) == 1
    bad = {"text": "x", "program": {"program_id": "", "shared_prefix_tokens": 1}}
    error(cluster.http.post("/generate", bad), 400, "program.program_id")
    bad = {"text": "x", "program": {"program_id": "p" * 200}}
    error(cluster.http.post("/generate", bad), 400, "program_id")


def test_our_runtime_endpoint_takes_the_http_url(cluster: Cluster) -> None:
    endpoint = sgl.RuntimeEndpoint(cluster.url)
    assert endpoint.target == cluster.cluster.address  # the gRPC port, read off the URL
    endpoint.shutdown()


# ---- the real SGLang client ------------------------------------------------------------------


def test_sglang_runtime_endpoint_runs_programs(cluster: Cluster) -> None:
    if not (SGLANG_SITE / "sglang").is_dir():
        pytest.fail(f"the sglang frontend is not installed in {SGLANG_SITE} (`make setup`)")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{SGLANG_SITE}"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.router.sglang_client", cluster.url],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # SmolLM2-Instruct speaks ChatML: the client found it from model_path alone.
    assert out["model_path"] == SGLANG_MODEL_PATH
    assert out["chat_template"] == "chatml"
    full, literal, cut = out["stop_regex"]
    match = re.search(literal, full)
    assert match is not None and cut == full[: match.end()]
    a1, a2, messages = out["multi_turn"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1]["content"] == a1.strip() and a2
    character = json.loads(out["character"])
    assert set(character) == {"name", "house", "age"} and character["house"] in (
        "Red",
        "Green",
        "Blue",
    )
    ideas, rating, _ = out["options"]
    assert len(ideas) == 3 and rating in ([" good"], [" bad"])
    typed = out["typed"]
    assert re.fullmatch(r"[0-9]+", typed["hours"]) and re.fullmatch(r"[0-9]+", typed["legs"])
    assert typed["sky"] in ("True", "False") and typed["fruit"].startswith('"')
    assert "Final answer:" in out["react"]
    text, answer = out["parallel_encoding"]
    assert "Document 2: Berlin" in text and "Berlin" in answer
    # greedy_token_selection's " Paris" and " Berlin" are a near tie for this model: with
    # default workers the batch a request lands in moved it (" Berlin" once on a loaded
    # machine); the deterministic workers decide it the same way every time.
    select = out["select"]
    assert select["token_length_normalized"] == " Paris"
    assert select["unconditional_likelihood_normalized"] == " Paris"
    assert select["greedy_token_selection"] == " Paris"
    assert out["run_batch"] == ["555-1234", "555-4321", "555-7777"]
    pieces, whole = out["stream"]
    assert len(pieces) > 1 and "".join(pieces) == whole
    assert "".join(out["async_stream"][:-1]) == out["async_stream"][-1]
    assert out["flush_cache"] is True
    assert out["server_info"]["grpc_port"] == int(cluster.cluster.address.rsplit(":", 1)[1])
