"""The smollm2 HTTP cluster that tests/router/http/openai/ and tests/router/agents/ generate
through: session-scoped, so a test process starts it once for both packages (under
`make test` a process takes test modules one at a time, in any order, and a package
fixture would start again each time one of its modules came back after another's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from radixmesh.cluster.launch import LocalCluster
from tests.router.smollm2_http import smollm2_http_cluster


@pytest.fixture(scope="session")
def smollm2_http(smollm2_gguf: Path) -> Iterator[tuple[LocalCluster, int]]:
    """The running cluster (one float32 worker) and its router's HTTP port."""
    with smollm2_http_cluster() as running:
        yield running
