"""The package's tests that generate (tools, embeddings, logit_bias, echo, usage) do it on
the shared smollm2 cluster (a worker and a router with its HTTP API;
tests/router/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from radixmesh.cluster.launch import LocalCluster
from tests.router.http_helpers import Http
from tests.router.smollm2_http import MODEL as MODEL  # the tests import it from here


@dataclass
class Smollm2Cluster:
    cluster: LocalCluster
    http: Http
    client: openai.OpenAI


@pytest.fixture(scope="package")
def smollm2(smollm2_http: tuple[LocalCluster, int]) -> Iterator[Smollm2Cluster]:
    cluster, http_port = smollm2_http
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0
    )
    yield Smollm2Cluster(cluster, Http(http_port), client)
    client.close()
