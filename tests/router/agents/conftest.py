"""One smollm2 cluster (a worker and a router with its HTTP API) for the package's tests
that generate through Anthropic's and OpenAI's clients, started once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest

from radixmesh.cluster.launch import LocalCluster
from tests.router.http_helpers import Http
from tests.router.smollm2_http import MODEL as MODEL  # the tests import it from here
from tests.router.smollm2_http import smollm2_http_cluster


@dataclass
class AgentsCluster:
    cluster: LocalCluster
    http: Http
    anthropic: anthropic.Anthropic
    openai: openai.OpenAI


@pytest.fixture(scope="package")
def agents(smollm2_gguf: Path) -> Iterator[AgentsCluster]:
    with smollm2_http_cluster() as (cluster, http_port):
        url = f"http://127.0.0.1:{http_port}"
        claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
        gpt = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        yield AgentsCluster(cluster, Http(http_port), claude, gpt)
        claude.close()
        gpt.close()
