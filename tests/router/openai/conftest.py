"""One smollm2 cluster (a worker and a router with its HTTP API) for the package's tests
that generate, started once: tools, embeddings, logit_bias, echo, usage."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from radixmesh.cluster.launch import LocalCluster
from tests.router.http_helpers import Http
from tests.router.smollm2_http import MODEL as MODEL  # the tests import it from here
from tests.router.smollm2_http import smollm2_http_cluster


@dataclass
class Smollm2Cluster:
    cluster: LocalCluster
    http: Http
    client: openai.OpenAI


@pytest.fixture(scope="package")
def smollm2(smollm2_gguf: Path) -> Iterator[Smollm2Cluster]:
    with smollm2_http_cluster() as (cluster, http_port):
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0
        )
        yield Smollm2Cluster(cluster, Http(http_port), client)
        client.close()
