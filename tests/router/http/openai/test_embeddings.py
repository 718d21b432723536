"""/v1/embeddings through the `openai` client and the SDK's Embed, on the bundled model:
shape, determinism, normalization, base64, and equality with transformers' hidden states
on the same weights."""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest
import torch

from radixmesh.client import Client
from tests.router.http.openai.conftest import MODEL, Smollm2Cluster

pytestmark = pytest.mark.slow
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France."]


def post(c: Smollm2Cluster, **fields: Any) -> Any:
    resp = c.http.post("/v1/embeddings", {"model": MODEL, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_the_openai_client_gets_unit_vectors(smollm2: Smollm2Cluster) -> None:
    # The client asks for base64 by default and decodes it.
    out = smollm2.client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in out.data] == [0, 1]
    for d in out.data:
        assert len(d.embedding) == 576
        assert math.fsum(x * x for x in d.embedding) == pytest.approx(1.0, abs=1e-5)
    floats = post(smollm2, input=TEXTS, encoding_format="float")
    for d, f in zip(out.data, floats["data"], strict=True):
        assert d.embedding == pytest.approx(f["embedding"], abs=1e-7)
    tokens = [smollm2.http.post("/tokenize", {"prompt": t}).json()["count"] for t in TEXTS]
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(tokens)
    again = smollm2.client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.embedding for d in again.data] == [d.embedding for d in out.data]  # deterministic


def test_raw_vectors_equal_transformers(smollm2: Smollm2Cluster, hf_smollm2: Any) -> None:
    ids = smollm2.http.post("/tokenize", {"prompt": TEXTS[0]}).json()["tokens"]
    with torch.no_grad():
        ref = hf_smollm2.model(torch.tensor([ids])).last_hidden_state[0]
    for pooling, expected in (("mean", ref.mean(dim=0)), ("last", ref[-1])):
        (data,) = post(smollm2, input=ids, pooling=pooling, normalize=False)["data"]
        got = torch.tensor(data["embedding"])
        assert torch.allclose(got, expected, atol=1e-4), (pooling, (got - expected).abs().max())


def test_the_sdk_embeds_through_the_router_and_on_a_worker(smollm2: Smollm2Cluster) -> None:
    raw = post(smollm2, input=TEXTS[1], normalize=False, encoding_format="float")
    with Client(smollm2.cluster.address) as client:
        assert client.model_info().hidden_size == 576
        e = client.embed(TEXTS[1])
        assert e.worker_id == "worker-0" and e.prompt_tokens > 0
        assert e.values == pytest.approx(raw["data"][0]["embedding"], abs=1e-6)
        last = client.embed(TEXTS[1], pooling="last")
        assert last.values != e.values
    worker_key = smollm2.cluster.worker_key
    with Client(
        smollm2.cluster.worker_addresses[0], service="worker", api_key=worker_key
    ) as worker:
        assert worker.embed(TEXTS[1]).values == pytest.approx(e.values, abs=1e-6)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": TEXTS, "dimensions": 64}, "dimensions"),
        ({"input": []}, "input"),
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": "x" * 40000}, "input"),  # longer than the context
        ({"input": "x", "pooling": "max"}, "pooling"),
        ({"input": [1, 99999]}, "input"),
    ],
)
def test_bad_requests_name_the_field(
    smollm2: Smollm2Cluster, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        smollm2.client.post("/embeddings", body={"model": MODEL, **fields}, cast_to=object)
    body = e.value.body
    assert isinstance(body, dict) and body["param"] == param
