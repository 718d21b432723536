"""SGLang's probes, scoring, reranking, profiler switches, vLLM's /reset_prefix_cache and
stop_regex on every path, against a real router.

A one-worker dummy:tiny cluster (byte tokenizer: a prompt's tokens are its UTF-8 bytes)
with a user and an admin key serves the successes; the router's HTTP front end with no
reachable worker (tests/router/http/openai/frontend.py) serves the errors and the 503s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import pytest

from radixmesh.client import Client
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.tokenizer import ByteTokenizer
from tests.router.http.openai.frontend import Frontend
from tests.router.http_helpers import Http, Response

pytestmark = pytest.mark.slow
USER, ADMIN = "user-key", "admin-key"
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
SIX = r"[\s\S]{6}"  # any six characters: ends a text at its sixth, whatever the model says


class Cluster:
    def __init__(self, cluster: LocalCluster, http_port: int) -> None:
        self.cluster = cluster
        self.user = Http(http_port, api_key=USER)
        self.admin = Http(http_port, api_key=ADMIN)
        self.anonymous = Http(http_port)

    def generate(self, text: str, **params: Any) -> Any:
        resp = self.user.post("/generate", {"text": text, "sampling_params": params})
        assert resp.status_code == 200, resp.text
        return resp.json()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    http_port = free_port()
    spec = LaunchSpec(
        model="dummy:tiny",
        workers=1,
        port=free_port(),
        worker_args=("--dtype", "float32"),
        router_options={"http_port": http_port, "health_interval": 0.2},
        api_keys=(USER,),
        admin_keys=(ADMIN,),
        ready_timeout=240.0,
    )
    with LocalCluster(spec) as c:
        yield Cluster(c, http_port)


@pytest.fixture(scope="module")
def idle() -> Iterator[Frontend]:
    """The front end with a model but no reachable worker."""
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), "dummy:tiny", context_length=64)
    yield f
    f.close()


def error(resp: Response, status: int, param: str | None) -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["param"] == param, err
    return str(err["message"])


# ---- probes ----------------------------------------------------------------------------


def test_ping_and_ready_answer_200_while_serving_without_a_key(cluster: Cluster) -> None:
    for path in ("/ping", "/ready"):
        resp = cluster.anonymous.get(path)
        assert (resp.status_code, resp.text) == (200, "")


def test_ping_and_ready_answer_503_with_retry_after_without_a_healthy_worker(
    idle: Frontend,
) -> None:
    for path in ("/ping", "/ready"):
        resp = idle.http.get(path)
        assert (resp.status_code, resp.text, resp.headers["retry-after"]) == (503, "", "1")


# ---- /v1/score ---------------------------------------------------------------------------


def test_score_is_the_probability_of_each_label_after_query_and_item(cluster: Cluster) -> None:
    body = {"query": "The answer is", "items": [" yes", " no"], "label_token_ids": [48, 49, 50]}
    resp = cluster.user.post("/v1/score", {**body, "return_token_logprobs": True})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert (out["object"], out["model"]) == ("scoring", "dummy:tiny")
    assert out["usage"] == {"prompt_tokens": 33, "completion_tokens": 0, "total_tokens": 33}
    assert len(out["scores"]) == 2 and all(len(s) == 3 for s in out["scores"])
    for scores, lps in zip(out["scores"], out["token_logprobs"], strict=True):
        assert scores == [math.exp(lp) for lp in lps]
    # The same numbers as the worker's own Score of each label after the joined prompt.
    with Client(cluster.cluster.address, api_key=USER) as client:
        for item, lps in zip(body["items"], out["token_logprobs"], strict=True):
            sel = client.select(f"The answer is{item}", [chr(48), chr(49), chr(50)])
            assert [pytest.approx(x) for x in sel.sum_logprobs] == lps
    soft = cluster.user.post(
        "/v1/score", {**body, "apply_softmax": True, "item_first": True, "temperature": 0.5}
    ).json()["scores"]
    assert all(abs(sum(row) - 1) < 1e-9 for row in soft)
    ids = cluster.user.post(
        "/v1/score",
        {"query": [84, 104], "items": [[101], [32]], "label_token_ids": [[48], [49, 50]]},
    ).json()
    assert [len(s) for s in ids["scores"]] == [1, 2]


def test_bad_score_requests_name_the_field(idle: Frontend) -> None:
    base: dict[str, Any] = {"query": "q", "items": ["a"], "label_token_ids": [1]}
    cases = [
        ({**base, "query": ""}, "query"),
        ({**base, "items": []}, "items"),
        ({**base, "items": ["a"] * 65}, "items"),
        ({**base, "query": [1, 2], "items": ["a"]}, "items[0]"),
        ({**base, "label_token_ids": [256]}, "label_token_ids"),
        ({**base, "label_token_ids": [[1], [2]]}, "label_token_ids"),
        ({**base, "temperature": 0}, "temperature"),
        ({**base, "apply_softmax": "yes"}, "apply_softmax"),
        ({**base, "score_extraction_token": "<s>"}, "score_extraction_token"),
        ({**base, "nonsense": 1}, "nonsense"),
        ({**base, "items": ["x" * 70]}, "items[0]"),  # past the 64-token context
        ({**base, "model": "other"}, "model"),
    ]
    for body, param in cases:
        resp = idle.http.post("/v1/score", body)
        error(resp, 404 if param == "model" else 400, param)
    assert error(idle.http.post("/v1/score", base), 503, None)  # valid: no worker to ask


# ---- /v1/rerank --------------------------------------------------------------------------


def test_rerank_ranks_documents_by_the_models_yes(cluster: Cluster) -> None:
    docs = ["Paris is in France.", "Bananas are yellow.", "The sky is blue."]
    body = {"query": "Where is Paris?", "documents": docs}
    resp = cluster.user.post("/v1/rerank", body)
    assert resp.status_code == 200, resp.text
    ranked = resp.json()
    assert sorted(r["index"] for r in ranked) == [0, 1, 2]
    assert [r["score"] for r in ranked] == sorted((r["score"] for r in ranked), reverse=True)
    assert all(0 < r["score"] < 1 and r["document"] == docs[r["index"]] for r in ranked)
    top = cluster.user.post("/v1/rerank", {**body, "top_n": 1, "return_documents": False})
    assert top.json() == [{"score": ranked[0]["score"], "index": ranked[0]["index"]}]


def test_bad_rerank_requests_name_the_field(idle: Frontend) -> None:
    base: dict[str, Any] = {"query": "q", "documents": ["a"]}
    for body, param in [
        ({**base, "query": [{"type": "text", "text": "q"}]}, "query"),
        ({**base, "documents": []}, "documents"),
        ({**base, "documents": ["a", 5]}, "documents[1]"),
        ({**base, "top_n": 0}, "top_n"),
        ({**base, "documents": ["x" * 70]}, "documents[0]"),
        ({**base, "extra": 1}, "extra"),
    ]:
        error(idle.http.post("/v1/rerank", body), 400, param)


# ---- profiler, /reset_prefix_cache ---------------------------------------------------------


def test_profiling_is_refused_with_a_clear_501(cluster: Cluster) -> None:
    for method in ("GET", "POST"):
        for path in ("/start_profile", "/stop_profile"):
            resp = cluster.admin.request(method, path)
            message = error(resp, 501, None)
            assert message.startswith(f"{path}: no profiler runs in this server")


def test_reset_prefix_cache_is_an_admins_and_flushes(cluster: Cluster) -> None:
    cluster.generate("a prompt to cache", **GREEDY)
    denied = cluster.user.post("/reset_prefix_cache", b"")
    assert denied.status_code == 403, denied.text
    resp = cluster.admin.post("/reset_prefix_cache", b"")
    assert (resp.status_code, resp.text) == (200, "")
    again = cluster.generate("a prompt to cache", **GREEDY)
    assert again["meta_info"]["cached_tokens"] == 0  # the flush emptied the cache


# ---- stop_regex ------------------------------------------------------------------------------


def test_stop_regex_on_generate_openai_and_grpc(cluster: Cluster) -> None:
    prompt = "Once upon a time"
    params = {**GREEDY, "max_new_tokens": 32}  # random bytes: fewer characters than tokens
    full = cluster.generate(prompt, **params)["text"]
    assert len(full) > 6
    out = cluster.generate(prompt, **params, stop_regex=SIX)
    assert out["text"] == full[:6]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": SIX}
    literal = re.escape(full[3:5])
    out = cluster.generate(prompt, **params, stop_regex=[r"\d{9}", literal])
    end = re.search(literal, full)
    assert end is not None and out["text"] == full[: end.end()]

    completion = cluster.user.post(
        "/v1/completions",
        {"model": "dummy:tiny", "prompt": prompt, "max_tokens": 32, "temperature": 0,
         "ignore_eos": True, "stop_regex": SIX},
    )  # fmt: skip
    assert completion.status_code == 200, completion.text
    choice = completion.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (full[:6], "stop")

    with Client(cluster.cluster.address, api_key=USER) as client:
        chunk = client.generate(prompt, {**params, "stop_regex": [SIX]})
    assert chunk.text == full[:6]

    bad = cluster.user.post(
        "/generate", {"text": prompt, "sampling_params": {"stop_regex": "(unclosed"}}
    )
    assert "is not a regular expression" in error(bad, 400, "sampling_params.stop_regex")
