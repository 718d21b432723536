"""The package's tests that generate through Anthropic's and OpenAI's clients do it on the
shared smollm2 cluster (a worker and a router with its HTTP API; tests/router/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import openai
import pytest

from radixmesh.cluster.launch import LocalCluster
from tests.router.http_helpers import Http
from tests.router.smollm2_http import MODEL as MODEL  # the tests import it from here


@dataclass
class AgentsCluster:
    cluster: LocalCluster
    http: Http
    anthropic: anthropic.Anthropic
    openai: openai.OpenAI


@pytest.fixture(scope="package")
def agents(smollm2_http: tuple[LocalCluster, int]) -> Iterator[AgentsCluster]:
    cluster, http_port = smollm2_http
    url = f"http://127.0.0.1:{http_port}"
    claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    gpt = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    yield AgentsCluster(cluster, Http(http_port), claude, gpt)
    claude.close()
    gpt.close()
