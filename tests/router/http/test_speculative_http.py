"""Speculative decoding through a router: the per-request `speculative` switch on every
front door (SGLang's /generate, OpenAI's completions and chat, Anthropic's messages, the
gRPC client) and the per-request draft counters back out (SGLang's meta_info over HTTP and
in the language's, the SDK's chunks; OpenAI's usage keeps its own shape).

A one-worker dummy:tiny cluster whose worker speculates (ngram); its byte tokenizer
makes a prompt's tokens its UTF-8 bytes, and a repeating prompt is one greedy decoding
copies from, so its drafts are accepted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import radixmesh as sgl
from radixmesh.client import Client
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.lang.backend.runtime import RuntimeEndpoint
from tests.router.http_helpers import Http, Response

pytestmark = pytest.mark.slow
MODEL = "dummy:tiny"
PROMPT = "abcabcabcabc"
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
SPEC_KEYS = {"spec_verify_ct", "spec_draft_tokens", "spec_accepted_tokens"}


class Cluster:
    def __init__(self, cluster: LocalCluster, http_port: int) -> None:
        self.cluster = cluster
        self.http = Http(http_port)

    def generate(self, **params: Any) -> Any:
        resp = self.http.post("/generate", {"text": PROMPT, "sampling_params": params})
        assert resp.status_code == 200, resp.text
        return resp.json()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    http_port = free_port()
    spec = LaunchSpec(
        model=MODEL,
        workers=1,
        port=free_port(),
        worker_args=("--dtype", "float32", "--speculative", "ngram"),
        router_options={"http_port": http_port, "health_interval": 0.2},
        ready_timeout=240.0,
    )
    with LocalCluster(spec) as c:
        yield Cluster(c, http_port)


def error_param(resp: Response) -> str:
    assert resp.status_code == 400, resp.text
    return str(resp.json()["error"]["param"])


def test_generate_reports_drafts_and_a_request_may_opt_out(cluster: Cluster) -> None:
    drafting = cluster.generate(**GREEDY)
    meta = drafting["meta_info"]
    assert meta["spec_verify_ct"] > 0
    assert meta["spec_verify_ct"] <= meta["spec_draft_tokens"]
    assert 0 < meta["spec_accepted_tokens"] <= meta["spec_draft_tokens"]
    plain = cluster.generate(**GREEDY, speculative=False)
    assert SPEC_KEYS.isdisjoint(plain["meta_info"])
    assert plain["output_ids"] == drafting["output_ids"]
    assert cluster.generate(**GREEDY, speculative=True)["output_ids"] == drafting["output_ids"]


def test_generate_refuses_a_speculative_that_is_not_a_bool(cluster: Cluster) -> None:
    bad: Any
    for bad in ("x", 1, []):
        body = {"text": PROMPT, "sampling_params": {**GREEDY, "speculative": bad}}
        assert error_param(cluster.http.post("/generate", body)) == "sampling_params.speculative"


def test_openai_and_anthropic_take_speculative_as_an_extra_field(cluster: Cluster) -> None:
    drafting = cluster.generate(**GREEDY)["text"]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    for value in (True, False):
        resp = cluster.http.post(
            "/v1/completions", {**body, "ignore_eos": True, "speculative": value}
        )
        assert resp.status_code == 200, resp.text
        reply = resp.json()
        assert reply["choices"][0]["text"] == drafting
        assert set(reply["usage"]) == {  # OpenAI's, nothing of speculation
            "prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"
        }  # fmt: skip
    assert error_param(cluster.http.post("/v1/completions", {**body, "speculative": "x"})) == (
        "speculative"
    )
    chat = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
    assert (
        cluster.http.post("/v1/chat/completions", {**chat, "speculative": False}).status_code == 200
    )
    assert error_param(cluster.http.post("/v1/chat/completions", {**chat, "speculative": 0})) == (
        "speculative"
    )
    assert cluster.http.post("/v1/messages", {**chat, "speculative": False}).status_code == 200
    refused = cluster.http.post("/v1/messages", {**chat, "speculative": "x"})
    assert refused.status_code == 400, refused.text  # Anthropic's errors name it in the text
    assert refused.json()["error"] == {
        "type": "invalid_request_error",
        "message": "speculative: Input should be a valid boolean",
    }


def test_the_grpc_client_sends_the_switch_and_reads_the_counters(cluster: Cluster) -> None:
    with Client(cluster.cluster.address) as client:
        drafting = client.generate(PROMPT, GREEDY)
        plain = client.generate(PROMPT, {**GREEDY, "speculative": False})
        streamed = list(client.generate(PROMPT, GREEDY, stream=True))
    assert drafting.spec_verify_steps > 0
    assert 0 < drafting.spec_accepted_tokens <= drafting.spec_drafted_tokens
    assert (plain.spec_verify_steps, plain.spec_drafted_tokens, plain.spec_accepted_tokens) == (
        0,
        0,
        0,
    )
    assert plain.token_ids == drafting.token_ids
    last = streamed[-1]
    assert (last.spec_verify_steps, last.spec_accepted_tokens) == (
        drafting.spec_verify_steps,
        drafting.spec_accepted_tokens,
    )


@sgl.function
def copy(s: Any) -> None:
    s += PROMPT + sgl.gen("out", max_tokens=12, temperature=0, ignore_eos=True)


def test_the_languages_meta_info_has_the_engines_counters(cluster: Cluster) -> None:
    meta = cluster.generate(**GREEDY)["meta_info"]
    endpoint = RuntimeEndpoint(cluster.cluster.address)
    try:
        got = copy.run(backend=endpoint).get_meta_info("out")
    finally:
        endpoint.shutdown()
    assert {k: got[k] for k in SPEC_KEYS} == {k: meta[k] for k in SPEC_KEYS}
