"""A smollm2 cluster (one float32 worker, a router with its HTTP API) for test packages
that generate through real HTTP clients."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec

MODEL = "smollm2"


@contextmanager
def smollm2_http_cluster() -> Iterator[tuple[LocalCluster, int]]:
    """The running cluster and its router's HTTP port."""
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
        yield cluster, http_port
