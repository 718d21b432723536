"""Grammar affinity on a launched cluster (4 dummy:tiny workers, one cache_aware router):
8 JSON schemas, 3 requests each, sent one at a time with cold prompts, so every worker
ties on every request. A schema's later requests go to the worker that compiled it: the
router heard of the compile (the worker's grammar event) before the next request
(bench/grammar_affinity.py waits for that; the workload is the bench's). Each schema
compiles at most twice (once, unless a load report read while a request still ran makes
its worker look busy for a moment), where without affinity it is up to 3 times here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.grammar_affinity import SCHEMAS, launch, run
from radixmesh.cluster.launch import LocalCluster, free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalCluster, str]]:
    port = free_port()
    with launch(port) as c:
        yield c, f"http://127.0.0.1:{port}/metrics"


def test_each_schema_compiles_at_most_twice(cluster: tuple[LocalCluster, str]) -> None:
    c, metrics_url = cluster
    result = run(c.address, metrics_url, c.worker_addresses, "test", rounds=3)
    compiles = result["compiles_per_schema"]
    assert isinstance(compiles, list)
    # Without affinity, 3 requests spread over 4 tied workers at random compile a schema 3
    # times with probability 3/8, so some schema of 8 does with probability 0.98.
    assert len(compiles) == SCHEMAS and max(compiles) <= 2, compiles
    placed = result["workers_per_schema"]
    assert isinstance(placed, dict)
    assert all(len(set(workers)) <= 2 for workers in placed.values()), placed
