"""Ray mode over three Ray nodes: two tensor-parallel workers, each on one node; then six
workers spread by one placement group, and a node lost under a steady load (dummy:tiny).

The nodes are three raylets of this machine (`ray.cluster_utils.Cluster`); the router runs
on the head, the driver's node, which is never the one removed (losing the head loses
Ray's GCS). The node is removed without grace (its raylet SIGKILLed), as a machine that
loses power is. The GCS here checks node health every second and calls a node dead
after three misses (Ray's default: 3 s and 5), so that the test waits less for the restart.

The requests in flight on the lost node are made certain rather than likely: the lost
workers' processes are frozen (SIGSTOP) until the router has sent each of them one, so
the router's retry is what the test sees, whatever the timing of the machine.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from radixmesh.client import Client
from radixmesh.cluster.launch import free_port
from radixmesh.cluster.ray_launch import RayCluster
from radixmesh.cluster.spec import LaunchSpec, RayOptions
from radixmesh.router.pool import snapshot_blocks
from radixmesh.v1 import worker_pb2, worker_pb2_grpc
from tests.cluster.ray_nodes import ray_nodes
from tests.cluster.test_ray import WORKER_ARGS

WORKERS = 6
NEW_TOKENS = 64
PARAMS = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
LOAD_THREADS = 6


@pytest.fixture(scope="module")
def three_nodes(ray_turn: None) -> Iterator[Any]:
    fast_node_death = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    with ray_nodes(3, num_cpus=2, _system_config=fast_node_death) as nodes:
        yield nodes


def _spec() -> LaunchSpec:
    return LaunchSpec(
        model="dummy:tiny",
        workers=WORKERS,
        port=free_port(),
        device="cpu",
        worker_args=WORKER_ARGS,
        router_options={"health_interval": 0.2, "seed": 0, "metrics_port": free_port()},
        ready_timeout=300.0,  # Ray's processes start slowly on a loaded 2-core machine
        # Two CPUs a node, half a CPU a worker: a node holds four, so two survivors hold six.
        ray=RayOptions(cpus_per_worker=0.5, worker_placement="spread"),
    )


@pytest.fixture(scope="module")
def cluster(three_nodes: Any) -> Iterator[RayCluster]:
    import ray

    # SPREAD is best effort: with an earlier cluster's CPUs not yet given back (the
    # tensor-parallel test's), it put four bundles on one node.
    _wait_for(lambda: ray.available_resources().get("CPU", 0) == 6, timeout=120)
    with RayCluster(_spec()) as c:
        yield c


def _wait_for(predicate: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value


def _summaries(cluster: RayCluster) -> dict[str, dict[str, Any]]:
    import ray

    return dict(ray.get(cluster.router.summaries.remote()))


def _alive_nodes() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


@pytest.mark.slow
def test_a_spread_tensor_parallel_worker_keeps_its_ranks_on_one_node(three_nodes: Any) -> None:
    """Two tp_size 2 workers (CPU, gloo): a bundle each of both ranks' CPUs, on two nodes;
    each worker's reservation sits on its worker's node, and the worker serves. First in
    the module and on its own, before the six workers start: beside them, the machine's
    memory (a worker process is ~0.7 GB) ran out while the other test process ran too."""
    import ray

    config = dataclasses.replace(_spec(), workers=2, tp_size=2, router_options={"seed": 0})
    with RayCluster(config) as tp:
        (pg,) = tp.placement_groups[:1]
        table = ray.util.placement_group_table(pg)
        assert (table["strategy"], table["state"]) == ("SPREAD", "CREATED")
        assert list(table["bundles"].values()) == [{"CPU": 1.0}] * 2
        nodes = tp.worker_nodes()
        assert nodes == tp.worker_bundle_nodes() and len(set(nodes)) == 2
        assert ray.get([r.node_id.remote() for r in tp.reservations]) == nodes
        for worker in tp.workers:
            _, child = ray.get(worker.pids.remote())
            with open(f"/proc/{child}/cmdline") as f:
                argv = f.read().split("\0")
            assert argv[argv.index("--tp-size") + 1] == "2"
        with Client(tp.address) as client:
            out = client.generate(input_ids=[1, 5, 9, 200] * 4, sampling_params=PARAMS)
        assert len(out.token_ids) == NEW_TOKENS
    assert ray.util.placement_group_table(pg)["state"] == "REMOVED"


@pytest.mark.slow
def test_spread_workers_sit_evenly_on_the_nodes_the_table_names(cluster: RayCluster) -> None:
    import ray

    (pg,) = cluster.placement_groups
    table = ray.util.placement_group_table(pg)
    assert (table["strategy"], table["state"]) == ("SPREAD", "CREATED")
    assert list(table["bundles"].values()) == [{"CPU": 0.5}] * WORKERS
    # Where each actor says it runs is where Ray's table put its bundle.
    nodes = cluster.worker_nodes()
    assert nodes == cluster.worker_bundle_nodes()
    assert set(nodes) == _alive_nodes()
    assert sorted(collections.Counter(nodes).values()) == [2, 2, 2]


@dataclass
class Load:
    """Clients sending generations in a loop until stopped; each outcome is kept. The
    clients do not retry (max_retries 0): a request the router loses, the test sees."""

    address: str
    done: list[tuple[float, float, str, int]] = field(default_factory=list)  # sent, ended
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for k in range(LOAD_THREADS):
            self.threads.append(threading.Thread(target=self._run, args=(k,), daemon=True))
            self.threads[-1].start()

    def _run(self, k: int) -> None:
        with Client(self.address, max_retries=0, timeout=120) as client:
            i = 0
            while not self.stop.is_set():
                ids = [3 + (k * 50 + i) % 500, 5, 9, 200 + k, 31, 7] * 4  # a new prefix each
                sent = time.monotonic()
                try:
                    out = client.generate(input_ids=ids, sampling_params=PARAMS)
                    self.done.append((sent, time.monotonic(), out.worker_id, len(out.token_ids)))
                except Exception as e:
                    self.errors.append(repr(e))
                i += 1

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def _router_metrics(cluster: RayCluster) -> str:
    (address,) = cluster.router_metrics_addresses()
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Each sample of metric `name` in a /metrics page: its labels and value."""
    found = []
    for labels, value in re.findall(rf"^{name}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        found.append((dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    return found


def _worker_snapshot(address: str, key: str) -> tuple[int, int, int]:
    """(epoch, sequence, blocks on the device) as the worker itself reports its cache."""
    with grpc.insecure_channel(address) as channel:
        snap = worker_pb2_grpc.WorkerStub(channel).GetCacheSnapshot(
            worker_pb2.GetCacheSnapshotRequest(),
            metadata=(("authorization", f"Bearer {key}"),),
            timeout=10,
        )
    return snap.epoch, snap.sequence, len(snapshot_blocks(snap.events))


@pytest.mark.slow
def test_a_node_lost_under_load_loses_no_request_and_its_workers_return(
    three_nodes: Any, cluster: RayCluster
) -> None:
    import ray

    head = three_nodes.head_node.node_id
    lost = next(n for n in three_nodes.worker_nodes if n.node_id != head)
    doomed = [f"worker-{i}" for i, n in enumerate(cluster.worker_nodes()) if n == lost.node_id]
    assert len(doomed) == 2
    before = _summaries(cluster)
    load = Load(cluster.address)
    load.start()
    _wait_for(lambda: len(load.done) >= LOAD_THREADS)
    # Freeze the doomed workers until each holds a request of the router's.
    for wid in doomed:
        _, child = ray.get(cluster.workers[int(wid.split("-")[1])].pids.remote())
        os.kill(child, signal.SIGSTOP)
    held = _wait_for(
        lambda: (s := _summaries(cluster)) and all(s[w]["in_flight"] for w in doomed) and s
    )
    in_flight = sum(held[w]["in_flight"] for w in doomed)

    lost_at = time.monotonic()
    three_nodes.remove_node(lost, allow_graceful=False)

    def back() -> dict[str, dict[str, Any]] | None:
        now = _summaries(cluster)
        moved = all(
            now[w]["address"] != before[w]["address"]
            and now[w]["epoch"] not in (0, before[w]["epoch"])
            for w in doomed
        )
        return now if moved and all(s["healthy"] for s in now.values()) else None

    after = _wait_for(back, timeout=120)
    whole_again = time.monotonic() - lost_at
    _wait_for(lambda: sum(1 for d in load.done if d[0] > lost_at + whole_again) >= LOAD_THREADS)
    load.end()

    # No request lost: each ended with all its tokens, none failed; the ones the lost
    # node held were sent again by the router (the clients do not retry).
    assert load.errors == []
    assert {n for *_, n in load.done} == {NEW_TOKENS}
    metrics = _router_metrics(cluster)
    failed_there = sum(
        value
        for labels, value in _samples(metrics, "radixmesh_router_worker_requests_total")
        if labels["worker"] in doomed and labels["status"] == "UNAVAILABLE"
    )
    assert failed_there >= in_flight >= 2
    ((_, retries),) = _samples(metrics, "radixmesh_router_retries_total")
    assert retries >= failed_there
    # Serving on: requests sent after the loss were answered long before the lost workers
    # were back (by the four others).
    served = sorted(end - lost_at for sent, end, *_ in load.done if sent > lost_at)
    assert served[0] < whole_again

    # The lost workers' bundles were placed again on the surviving nodes, and their
    # actors restarted there: the table and the actors agree.
    (pg,) = cluster.placement_groups
    assert ray.util.placement_group_table(pg)["state"] == "CREATED"
    nodes = cluster.worker_nodes()
    assert nodes == cluster.worker_bundle_nodes()
    assert lost.node_id not in nodes and set(nodes) == _alive_nodes()

    # The router forgot the lost processes' caches and follows the new ones': each
    # worker's summary is the worker's own cache (its epoch, sequence and blocks).
    key = cluster.config.worker_api_key
    assert key is not None

    def synced() -> bool:
        now = _summaries(cluster)
        return all(
            (s["epoch"], s["sequence"], s["cached_blocks"]) == _worker_snapshot(s["address"], key)
            for s in now.values()
        )

    _wait_for(synced, timeout=30)
    for w in doomed:
        assert after[w]["resyncs"] > before[w]["resyncs"]
    print(
        f"\nnode loss: {len(load.done)} requests served, 0 lost, {in_flight} in flight on "
        f"the lost node retried; first answer after the loss {served[0]:.1f} s; all "
        f"{WORKERS} workers serving again {whole_again:.1f} s after it"
    )
