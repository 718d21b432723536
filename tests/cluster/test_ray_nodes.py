"""Ray mode over two Ray nodes: router replicas spread one per node (dummy:tiny).

The two nodes are two raylets of this machine (`ray.cluster_utils.Cluster`), so the
routers share the gRPC and HTTP ports through SO_REUSEPORT as they would a node's, and
their metrics ports differ (`host_rank`): both nodes report this machine's address.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from radixmesh.client import Client
from radixmesh.cluster.launch import free_port
from radixmesh.cluster.ray_launch import RayCluster
from radixmesh.cluster.spec import LaunchSpec, RayOptions
from radixmesh.errors import Unavailable
from radixmesh.worker.engine import Engine
from tests.cluster.ports import free_port_run
from tests.cluster.processes import refuses
from tests.cluster.ray_nodes import ray_nodes
from tests.cluster.test_ray import GREEDY, PROMPTS, WORKER_ARGS

HTTP_REQUESTS = re.compile(
    r'^radixmesh_router_requests_total\{[^}]*frontend="http"[^}]*\} (\S+)$', re.M
)


@pytest.fixture(scope="module")
def expected() -> list[int]:
    engine = Engine(model="dummy:tiny", dtype="float32")
    try:
        out = engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
        return list(out["output_ids"])  # type: ignore[index,call-overload]
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def two_nodes(ray_turn: None) -> Iterator[Any]:
    with ray_nodes(2, num_cpus=1) as nodes:
        yield nodes


def _spec(**ray_options: Any) -> LaunchSpec:
    metrics = free_port_run(2)  # two routers on this machine: the port and the next
    return LaunchSpec(
        model="dummy:tiny",
        workers=1,
        routers=2,
        port=free_port(),
        device="cpu",
        worker_args=WORKER_ARGS,
        router_options={
            "health_interval": 0.2,
            "seed": 0,
            "http_port": free_port(),
            "metrics_port": metrics,
        },
        ready_timeout=300.0,  # Ray's processes start slowly on a loaded 2-core machine
        # Half a CPU for the worker and a quarter per router: both nodes have one.
        ray=RayOptions(cpus_per_worker=0.5, router_cpus=0.25, **ray_options),
    )


def _wait_for(predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value


def _http_generate(port: int) -> list[int]:
    """One /generate on a new connection (SO_REUSEPORT picks a router per connection)."""
    body = json.dumps({"input_ids": PROMPTS[0], "sampling_params": GREEDY}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return list(json.loads(resp.read())["output_ids"])


def _http_requests(metrics_address: str) -> float:
    """HTTP requests this router has ended (its own /metrics port)."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as resp:
        return sum(float(n) for n in HTTP_REQUESTS.findall(resp.read().decode()))


@pytest.mark.slow
def test_spread_routers_run_one_per_node_and_each_serves(
    two_nodes: Any, expected: list[int]
) -> None:
    import ray

    config = _spec(router_placement="spread")
    with RayCluster(config) as cluster:
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        node_ids = ray.get([r.node_id.remote() for r in cluster.routers])
        assert len(alive) == 2 and sorted(node_ids) == sorted(alive)
        (pg,) = cluster.placement_groups
        table = ray.util.placement_group_table(pg)
        assert (table["strategy"], table["state"]) == ("STRICT_SPREAD", "CREATED")
        # One machine: the same gRPC port for both, metrics on the configured port and the next.
        base = config.router_options["metrics_port"]
        metrics = cluster.router_metrics_addresses()
        assert [int(a.rsplit(":", 1)[1]) for a in metrics] == [base, base + 1]
        assert cluster.addresses == [f"127.0.0.1:{config.port}"] * 2
        assert "routers 127.0.0.1:" in cluster.ready_line()
        # Each router holds the worker's summary, from its own event stream.
        for router in cluster.routers:
            (summary,) = ray.get(router.summaries.remote()).values()
            assert summary["healthy"] and summary["epoch"] != 0

        # New connections until each router has answered one (the kernel hashes each
        # connection to one of the two sockets: 40 misses in a row are a 2^-39 chance).
        http_port = config.router_options["http_port"]
        served = [0.0, 0.0]
        for _ in range(40):
            assert _http_generate(http_port) == expected
            served = [_http_requests(a) for a in metrics]
            if all(served):
                break
        assert all(served), served
        with Client(cluster.address) as client:
            out = client.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)
        assert out.token_ids == expected

        # One router dead for good: logged, and the other serves on; none left: stop.
        # (ray.kill only asks: a call sent at once may still be answered.)
        ray.kill(cluster.routers[1], no_restart=True)
        _wait_for(lambda: cluster.dead_routers() == ["router-1"])
        assert cluster.failure() is None
        # Its process is gone once its own port refuses: its share of the gRPC and HTTP
        # ports closed with it, and every new connection reaches router-0.
        _wait_for(lambda: refuses(metrics[1]))
        for _ in range(3):
            assert _http_generate(http_port) == expected
        ray.kill(cluster.routers[0], no_restart=True)
        assert _wait_for(cluster.failure) == "no router left"


@pytest.mark.slow
def test_spread_routers_need_as_many_nodes(two_nodes: Any) -> None:
    """Three routers, one per node, on two nodes: the group cannot be placed, and the
    timeout says why."""
    config = dataclasses.replace(
        _spec(router_placement="spread"), routers=3, ready_timeout=5.0, stop_timeout=0.5
    )
    start = time.monotonic()
    cluster = RayCluster(config)
    with pytest.raises(Unavailable, match=r"needs 3 nodes with 0\.25 CPU free; the cluster has 2"):
        cluster.__enter__()  # starts, waits, and stops what it started when that fails
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_a_router_that_cannot_serve_fails_the_start_with_its_error(two_nodes: Any) -> None:
    """Its metrics port taken: the start fails at once with the router's error, rather
    than waiting for the readiness timeout."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        spec = _spec()
        options = {**spec.router_options, "metrics_port": taken.getsockname()[1]}
        config = dataclasses.replace(spec, routers=1, router_options=options, stop_timeout=0.5)
        start = time.monotonic()
        why = r"^router-0 failed during startup: the router at 127\.0\.0\.1:\d+ ended: OSError: "
        why += r".* in use$"
        with pytest.raises(Unavailable, match=why):
            RayCluster(config).__enter__()
        assert time.monotonic() - start < config.ready_timeout / 2
