"""One smollm2 cluster (a worker and a router with its HTTP API) for the package's tests
that generate through Anthropic's and OpenAI's clients, started once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from tests.router.http_helpers import Http

MODEL = "smollm2"


@dataclass
class AgentsCluster:
    cluster: LocalCluster
    http: Http
    anthropic: anthropic.Anthropic
    openai: openai.OpenAI


@pytest.fixture(scope="package")
def agents(smollm2_gguf: Path) -> Iterator[AgentsCluster]:
    http_port = free_port()
    config = LaunchSpec(
        model=MODEL,
        workers=1,
        port=free_port(),
        worker_args=("--dtype", "float32"),
        router_options={"http_port": http_port, "health_interval": 0.2},
        ready_timeout=240.0,
    )
    url = f"http://127.0.0.1:{http_port}"
    with LocalCluster(config) as cluster:
        claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
        gpt = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        yield AgentsCluster(cluster, Http(http_port), claude, gpt)
        claude.close()
        gpt.close()
