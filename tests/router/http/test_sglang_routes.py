"""SGLang's probes, scoring, reranking (and vLLM's and Cohere's shapes of them), profiler
switches, vLLM's /reset_prefix_cache and stop_regex on every path, against a real router.

A one-worker dummy:tiny cluster (byte tokenizer: a prompt's tokens are its UTF-8 bytes)
with a user and an admin key serves the successes; the router's HTTP front end with no
reachable worker (tests/router/http/openai/frontend.py) serves the errors and the 503s.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import requests

from radixmesh.client import Client
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.router.http.score_protocol import rerank_prompt
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
        self.url = f"http://127.0.0.1:{http_port}"
        self.key = {"Authorization": f"Bearer {USER}"}
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


# ---- reranking and vLLM's scores ----------------------------------------------------------
# Every shape scores through one path (the model's yes / no on `rerank_prompt`), so a query
# and a document get the same score on every route; sent with `requests` and `aiohttp`, as
# those APIs' users send them.

QUERY = "Where is Paris?"
DOCS = ["Paris is in France.", "Bananas are yellow.", "The sky is blue."]


def post(cluster: Cluster, path: str, body: dict[str, Any]) -> Any:
    resp = requests.post(cluster.url + path, json=body, headers=cluster.key, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.fixture(scope="module")
def sglang_scores(cluster: Cluster) -> list[float]:
    """Each document's score from SGLang's /v1/rerank (its documented body: with model)."""
    ranked = post(cluster, "/v1/rerank", {"model": "dummy:tiny", "query": QUERY, "documents": DOCS})
    assert sorted(r["index"] for r in ranked) == [0, 1, 2]
    assert all(r["document"] == DOCS[r["index"]] for r in ranked)
    scores = [0.0] * len(DOCS)
    for r in ranked:
        scores[r["index"]] = r["score"]
    assert [r["score"] for r in ranked] == sorted(scores, reverse=True)
    assert all(0 < s < 1 for s in scores)
    return scores


def best_first(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def prompt_tokens(pairs: list[tuple[str, str]]) -> int:
    return sum(len(rerank_prompt(q, d, None).encode()) for q, d in pairs)


def test_sglang_rerank_takes_top_n_and_the_cohere_body(
    cluster: Cluster, sglang_scores: list[float]
) -> None:
    body = {"query": QUERY, "documents": DOCS, "top_n": 1, "return_documents": False}
    top = best_first(sglang_scores)[0]
    assert post(cluster, "/v1/rerank", body) == [{"score": sglang_scores[top], "index": top}]
    objects = {**body, "model": "dummy:tiny", "documents": [{"text": d} for d in DOCS]}
    assert post(cluster, "/v1/rerank", {**objects, "top_n": 2}) == [
        {"score": sglang_scores[i], "index": i} for i in best_first(sglang_scores)[:2]
    ]


@pytest.mark.parametrize("path", ["/rerank", "/v2/rerank"])
def test_rerank_results_carry_index_and_relevance_score(
    cluster: Cluster, path: str, sglang_scores: list[float]
) -> None:
    out = post(cluster, path, {"model": "dummy:tiny", "query": QUERY, "documents": DOCS})
    assert out["id"].startswith("rerank-") and out["model"] == "dummy:tiny"
    tokens = prompt_tokens([(QUERY, d) for d in DOCS])
    assert out["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert out["results"] == [
        {"index": i, "relevance_score": sglang_scores[i], "document": {"text": DOCS[i]}}
        for i in best_first(sglang_scores)
    ]


def test_rerank_top_n_and_return_documents(cluster: Cluster, sglang_scores: list[float]) -> None:
    top = best_first(sglang_scores)[0]
    body = {"model": "dummy:tiny", "query": QUERY, "documents": DOCS}
    one = post(cluster, "/v2/rerank", {**body, "top_n": 1, "return_documents": False})
    assert one["results"] == [{"index": top, "relevance_score": sglang_scores[top]}]
    every = post(cluster, "/rerank", {**body, "top_n": 0})  # vLLM's default: all of them
    assert [r["index"] for r in every["results"]] == best_first(sglang_scores)
    # Cohere's and Jina's document objects read as their text.
    objects = post(cluster, "/v2/rerank", {**body, "documents": [{"text": d} for d in DOCS]})
    assert objects["results"] == every["results"]


def test_rerank_through_aiohttp(cluster: Cluster, sglang_scores: list[float]) -> None:
    async def call() -> Any:
        async with aiohttp.ClientSession(headers=cluster.key) as session:
            body = {"model": "dummy:tiny", "query": QUERY, "documents": DOCS, "top_n": 2}
            async with session.post(cluster.url + "/v2/rerank", json=body) as resp:
                assert resp.status == 200
                return await resp.json()

    out = asyncio.run(call())
    assert [(r["index"], r["relevance_score"]) for r in out["results"]] == [
        (i, sglang_scores[i]) for i in best_first(sglang_scores)[:2]
    ]


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_vllm_score_pairs_one_to_many(
    cluster: Cluster, path: str, sglang_scores: list[float]
) -> None:
    out = post(cluster, path, {"model": "dummy:tiny", "text_1": QUERY, "text_2": DOCS})
    assert out["id"].startswith("score-") and out["object"] == "list"
    assert out["model"] == "dummy:tiny" and isinstance(out["created"], int)
    assert out["data"] == [
        {"index": i, "object": "score", "score": s} for i, s in enumerate(sglang_scores)
    ]
    tokens = prompt_tokens([(QUERY, d) for d in DOCS])
    assert out["usage"] == {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}


def test_vllm_score_pairs_one_to_one_and_n_to_n(
    cluster: Cluster, sglang_scores: list[float]
) -> None:
    one = post(cluster, "/score", {"text_1": QUERY, "text_2": DOCS[1]})
    assert [d["score"] for d in one["data"]] == [sglang_scores[1]]
    # N to N under each of vLLM's names for the two sides; pair i is (first[i], second[i]).
    other = "What colour is the sky?"
    many = post(cluster, "/score", {"text_1": [QUERY, other], "text_2": DOCS[:2]})
    for first, second in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2")):
        again = post(cluster, "/v1/score", {first: [QUERY, other], second: DOCS[:2]})
        assert again["data"] == many["data"]
    assert many["data"][0]["score"] == sglang_scores[0]
    alone = post(cluster, "/score", {"text_1": other, "text_2": DOCS[1]})
    assert many["data"][1]["score"] == alone["data"][0]["score"]


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank", "/score", "/v1/score"])
def test_a_wrong_model_is_404_on_every_scoring_route(idle: Frontend, path: str) -> None:
    body: dict[str, Any] = {"model": "bge-reranker-v2-m3", "query": "q", "documents": ["a"]}
    if "score" in path:
        body = {"model": "bge-reranker-v2-m3", "text_1": "q", "text_2": ["a"]}
    resp = idle.http.post(path, body)
    assert error(resp, 404, "model") == (
        "the model 'bge-reranker-v2-m3' does not exist; this router serves 'dummy:tiny'"
    )
    assert resp.json()["error"]["code"] == "model_not_found"


def test_bad_rerank_requests_name_the_field(idle: Frontend) -> None:
    base: dict[str, Any] = {"query": "q", "documents": ["a"]}
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    text_only = 'expected a string or {"text": string}: the served model takes text only'
    long = len(rerank_prompt("q", "x" * 70, None).encode())
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        ("/v1/rerank", {**base, "query": [{"type": "text", "text": "q"}]}, "query",
         "give a non-empty string (the served model takes text only)"),
        ("/v1/rerank", {**base, "documents": []}, "documents", "give a non-empty list of strings"),
        ("/v1/rerank", {**base, "documents": ["a", 5]}, "documents[1]", text_only),
        ("/v2/rerank", {**base, "documents": ["a", image]}, "documents[1]", text_only),
        ("/v1/rerank", {**base, "top_n": 0}, "top_n", "must be an integer >= 1, got 0"),
        ("/rerank", {**base, "top_n": -1}, "top_n", "must be an integer >= 0, got -1"),
        ("/v1/rerank", {**base, "documents": ["x" * 70]}, "documents[0]",
         f"the prompt is {long} tokens; the model's context is 64, with room for at least "
         "one generated token"),
        ("/v1/rerank", {**base, "extra": 1}, "extra", "unknown field 'extra'"),
        ("/v2/rerank", {**base, "rank_fields": ["x"]}, "rank_fields",
         "unknown field 'rank_fields'"),
    ]  # fmt: skip
    for path, body, param, message in cases:
        assert error(idle.http.post(path, body), 400, param) == message


def test_bad_vllm_score_requests_name_the_field(idle: Frontend) -> None:
    text_only = 'expected a string or {"text": string}: the served model takes text only'
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2",
         "2 text_1 for 3 text_2: pair 1 to 1, 1 to N or N to N"),
        ({"text_1": "a"}, "text_1",
         "give text_1 and text_2 (or queries and documents, queries and items, data_1 and "
         "data_2)"),
        ({"text_1": "a", "text_2": [5]}, "text_2[0]", text_only),
        ({"text_1": {"content": []}, "text_2": "b"}, "text_1", text_only),
        ({"text_1": "", "text_2": "b"}, "text_1", "give non-empty strings"),
        ({"text_1": "a", "text_2": "b", "label_token_ids": [1]}, "label_token_ids",
         "unknown field 'label_token_ids'"),
    ]  # fmt: skip
    for body, param, message in cases:
        assert error(idle.http.post("/score", body), 400, param) == message


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
