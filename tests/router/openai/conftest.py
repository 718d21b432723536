"""One smollm2 cluster (a worker and a router with its HTTP API) for the package's tests
that generate, started once: tools, embeddings, logit_bias, echo, usage."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from tests.router.http_helpers import Http

MODEL = "smollm2"


@dataclass
class Smollm2Cluster:
    cluster: LocalCluster
    http: Http
    client: openai.OpenAI


@pytest.fixture(scope="package")
def smollm2(smollm2_gguf: Path) -> Iterator[Smollm2Cluster]:
    http_port = free_port()
    config = LaunchSpec(
        model=MODEL,
        workers=1,
        port=free_port(),
        worker_args=("--dtype", "float32"),
        router_options={"http_port": http_port, "health_interval": 0.2},
        ready_timeout=240.0,
    )
    with LocalCluster(config) as cluster:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0
        )
        yield Smollm2Cluster(cluster, Http(http_port), client)
        client.close()
