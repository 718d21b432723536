"""Ray mode: router and workers as Ray actors on a real local Ray instance (dummy:tiny).

One module-scoped cluster (two workers, float32) serves every test; the restart test
kills one worker's actor process and the other worker's subprocess and checks that Ray
restarts both, the router follows the new addresses and resyncs the summaries.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from radixmesh.client import Client
from radixmesh.cluster.launch import free_port
from radixmesh.cluster.ray_actors import advertised_host, host_rank
from radixmesh.cluster.ray_launch import RayCluster
from radixmesh.cluster.ray_placement import bundles, rank_resources
from radixmesh.cluster.spec import LaunchSpec, RayOptions
from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from tests.cluster.ports import free_port_run
from tests.cluster.processes import ready_line, refuses

WORKER_ARGS = ("--dtype", "float32", "--event-block-size", "16")
PROMPTS = [[1, 5, 9, 200, 31, 7, 64, 12] * 3, [2, 8, 300, 41, 5] * 4]
GREEDY = {"max_new_tokens": 6, "temperature": 0.0}


@pytest.fixture(scope="module")
def expected() -> list[list[int]]:
    """What an in-process engine on the same weights (dummy:tiny, seed 0) generates."""
    engine = Engine(model="dummy:tiny", dtype="float32")
    try:
        outs = [engine.generate(input_ids=ids, sampling_params=GREEDY) for ids in PROMPTS]
        return [list(o["output_ids"]) for o in outs]  # type: ignore[index,call-overload]
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def cluster(ray_turn: None) -> Iterator[RayCluster]:
    import ray

    # Two GPUs as Ray resources only (no CUDA here): the tensor-parallel test reserves them.
    # address="local": a new cluster, never one found running on the machine.
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    config = LaunchSpec(
        model="dummy:tiny",
        workers=2,
        routers=2,  # on the driver's node, sharing the port
        port=free_port(),
        device="cpu",
        worker_args=WORKER_ARGS,
        router_options={"health_interval": 0.2, "seed": 0},
        ready_timeout=300.0,  # Ray's processes start slowly on a loaded 2-core machine
        # Half of Ray's 2 CPUs; the tensor-parallel test takes the rest.
        ray=RayOptions(cpus_per_worker=0.5),
    )
    try:
        with RayCluster(config) as c:
            yield c
    finally:
        ray.shutdown()


def _wait_for(predicate: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value


def _summaries(cluster: RayCluster) -> dict[str, dict[str, Any]]:
    import ray

    return dict(ray.get(cluster.router.summaries.remote()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by its parent) still answers kill(pid, 0).
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_cluster_serves_the_engines_tokens_through_the_router(
    cluster: RayCluster, expected: list[list[int]]
) -> None:
    with Client(cluster.address) as client:
        outs = [client.generate(input_ids=ids, sampling_params=GREEDY) for ids in PROMPTS]
    assert [o.token_ids for o in outs] == expected
    assert {o.worker_id for o in outs} <= {"worker-0", "worker-1"}
    assert sorted(_summaries(cluster)) == ["worker-0", "worker-1"]
    assert cluster.worker_addresses() == [s["address"] for s in _summaries(cluster).values()]
    # Both routers: on the driver's node, on the one port, each following both workers.
    import ray

    here = ray.get_runtime_context().get_node_id()
    assert ray.get([r.node_id.remote() for r in cluster.routers]) == [here, here]
    assert cluster.addresses == [cluster.address] * 2
    for router in cluster.routers:
        summaries = ray.get(router.summaries.remote())
        assert [s["address"] for s in summaries.values()] == cluster.worker_addresses()


@pytest.mark.slow
def test_ray_restarts_killed_workers_and_the_router_follows(
    cluster: RayCluster, expected: list[list[int]]
) -> None:
    import ray

    before = _summaries(cluster)
    assert all(s["healthy"] and s["epoch"] != 0 for s in before.values())
    actor_pid, child0 = ray.get(cluster.workers[0].pids.remote())
    _, child1 = ray.get(cluster.workers[1].pids.remote())
    ray.kill(cluster.workers[0], no_restart=False)  # the actor's process dies (SIGKILL)
    os.kill(child1, 9)  # worker 1's subprocess dies; its actor exits so that Ray restarts it

    def restarted() -> dict[str, dict[str, Any]] | None:
        now = _summaries(cluster)
        # epoch 0 is the moved-but-not-yet-resynced state (pool.py resets the summary on
        # a move); wait for the snapshot of the new process.
        done = all(
            now[w]["healthy"] and now[w]["epoch"] not in (0, before[w]["epoch"]) for w in now
        )
        return now if done else None

    after = _wait_for(restarted, timeout=90)
    # The worker subprocess died with its actor (PR_SET_PDEATHSIG).
    assert not _alive(child0) and not _alive(actor_pid)
    new_pids = [ray.get(w.pids.remote()) for w in cluster.workers]
    assert new_pids[0][0] != actor_pid and new_pids[1][1] != child1
    # The router reaches each worker where its restarted actor says it is now, on the
    # port its new subprocess picked, and pulled a fresh snapshot on the new epoch.
    assert [s["address"] for s in after.values()] == cluster.worker_addresses()
    for w in ("worker-0", "worker-1"):
        assert after[w]["resyncs"] > before[w]["resyncs"]
    with Client(cluster.address) as client:
        outs = [client.generate(input_ids=ids, sampling_params=GREEDY) for ids in PROMPTS]
    assert [o.token_ids for o in outs] == expected


@pytest.mark.slow
def test_tensor_parallel_worker_gets_a_placement_group(
    cluster: RayCluster, expected: list[list[int]]
) -> None:
    """A tp_size 2 worker on Ray's two (resource-only) GPUs: a STRICT_PACK group of two
    GPU bundles, the worker actor in bundle 0 and a reservation in bundle 1; the worker
    process sees both GPUs (it runs on CPU, gloo, since there is no CUDA here) and its
    tokens equal tp 1's."""
    import ray

    config = LaunchSpec(
        model="dummy:tiny",
        workers=1,
        port=free_port(),
        tp_size=2,
        device="cuda",
        worker_args=WORKER_ARGS,
        ready_timeout=300.0,
        ray=RayOptions(cpus_per_worker=0.5),
    )
    with RayCluster(config) as tp:
        (pg,) = tp.placement_groups
        table = ray.util.placement_group_table(pg)
        assert (table["strategy"], table["state"]) == ("STRICT_PACK", "CREATED")
        assert list(table["bundles"].values()) == [{"GPU": 1.0, "CPU": 0.5}] * 2
        assert len(tp.reservations) == 1
        _, child = ray.get(tp.workers[0].pids.remote())
        with open(f"/proc/{child}/cmdline") as f:
            argv = f.read().split("\0")
        assert argv[argv.index("--tp-size") + 1] == "2"
        with open(f"/proc/{child}/environ") as f:
            env = dict(e.split("=", 1) for e in f.read().split("\0") if "=" in e)
        assert sorted(env["CUDA_VISIBLE_DEVICES"].split(",")) == ["0", "1"]
        with Client(tp.address) as client:
            outs = [client.generate(input_ids=ids, sampling_params=GREEDY) for ids in PROMPTS]
        assert [o.token_ids for o in outs] == expected
    assert ray.util.placement_group_table(pg)["state"] == "REMOVED"


def _scrape(address: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


@pytest.mark.slow
def test_workers_on_one_node_have_distinct_reachable_metrics_ports(
    cluster: RayCluster,
) -> None:
    """Both workers share the one local node: each (re)start picked its own free metrics
    port (after the restart test, these are the restarted workers' ports)."""
    import ray

    metrics = cluster.worker_metrics_addresses()
    grpc = cluster.worker_addresses()
    assert metrics == [
        str(a) for a in ray.get([w.metrics_address.remote() for w in cluster.workers])
    ]
    hosts = {a.rsplit(":", 1)[0] for a in metrics + grpc}
    assert hosts == {"127.0.0.1"}
    ports = {a.rsplit(":", 1)[1] for a in metrics + grpc}
    assert len(ports) == 4
    for address in metrics:
        text = _scrape(address)
        running = r'^radixmesh_num_requests_running\{model_name="dummy:tiny"\} 0\.0$'
        assert re.search(running, text, re.M), text[:500]


def _worker_pid(port: str) -> int:
    """The `radixmesh worker` process serving gRPC on `port`."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline") as f:
                argv = f.read().split("\0")
                if "worker" in argv and argv[argv.index("--port") + 1 :][:1] == [port]:
                    return int(entry)
    raise AssertionError(f"no worker on port {port}")


@pytest.mark.slow
def test_launch_ray_address_serves_and_stops_on_sigterm(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """`radixmesh launch --ray-address` joins the running Ray instance (workers with no
    CPU reserved, since the cluster's two CPUs are taken), passes the router options to
    both router actors (API and admin keys, the HTTP and metrics ports), prints the routers'
    addresses and the workers' metrics addresses,
    logs a worker whose restarts are used up (--max-restarts 0) and serves on with the
    other, and SIGTERM (which ray.init takes over) stops its actors, as Ctrl-C does."""
    import urllib.error
    import urllib.request

    import ray

    # Two routers on this node: a metrics port each, the given one and the next.
    port, http_port, metrics_port = free_port(), free_port(), free_port_run(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixmesh.cluster.cli", "launch", "--model", "dummy:tiny",
         "--workers", "2", "--port", str(port), "--dtype", "float32", "--max-restarts", "0",
         "--ray-address", ray.get_runtime_context().gcs_address, "--cpus-per-worker", "0",
         "--ray-device", "cpu", "--routers", "2",
         "--api-key", "k1", "--admin-key", "a1",
         "--http-port", str(http_port), "--metrics-port", str(metrics_port)],
        stdout=subprocess.PIPE, stderr=(tmp_path / "stderr").open("w"), text=True,
    )  # fmt: skip
    try:
        ready = ready_line(proc, "radixmesh cluster ready (ray)")
        # Two routers on this node: one gRPC port, a metrics port each (the given and the next).
        router_metrics = [f"127.0.0.1:{metrics_port}", f"127.0.0.1:{metrics_port + 1}"]
        routers = (
            f"routers 127.0.0.1:{port}, 127.0.0.1:{port} (metrics {', '.join(router_metrics)})"
        )
        assert f"{routers}, workers" in ready
        assert all("radixmesh_router_requests_in_flight" in _scrape(a) for a in router_metrics)
        grpc, metrics = ready.split("workers", 1)[1].split("worker metrics")
        workers = re.findall(r"[0-9.]+:\d+", grpc)
        assert len(workers) == 2 and not set(workers) & set(cluster.worker_addresses())
        scraped = [_scrape(a) for a in re.findall(r"[0-9.]+:\d+", metrics)]
        assert len(scraped) == 2 and all("radixmesh_num_requests_running" in t for t in scraped)
        os.kill(_worker_pid(workers[1].rsplit(":", 1)[1]), signal.SIGKILL)
        log = (
            "radixmesh: error: worker-1 is dead for good (max_restarts 0 used up); "
            "1 worker(s) left\n"
        )
        _wait_for(lambda: log in (tmp_path / "stderr").read_text(), timeout=30)
        assert proc.poll() is None
        with Client(f"127.0.0.1:{port}", api_key="k1") as client:
            outs = [client.generate(input_ids=PROMPTS[0], sampling_params=GREEDY) for _ in "ab"]
        assert [o.worker_id for o in outs] == ["", ""]  # a client is not told which worker
        with Client(f"127.0.0.1:{port}", api_key="a1") as admin:  # the operator is
            outs = [admin.generate(input_ids=PROMPTS[0], sampling_params=GREEDY) for _ in "ab"]
        assert [o.worker_id for o in outs] == ["worker-0", "worker-0"]
        models = f"http://127.0.0.1:{http_port}/v1/models"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(models, timeout=10)
        assert denied.value.code == 401
        request = urllib.request.Request(models, headers={"Authorization": "Bearer k1"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        addresses = [f"127.0.0.1:{port}", f"127.0.0.1:{http_port}", *workers, *router_metrics]
        assert [refuses(a) for a in addresses] == [True] * 6
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_launch_ray_exits_1_when_no_worker_is_left(cluster: RayCluster, tmp_path: Path) -> None:
    """--max-restarts 0 and the only worker dies: the driver logs it, stops the cluster
    and exits 1."""
    import ray

    port = free_port()
    err = tmp_path / "stderr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixmesh.cluster.cli", "launch", "--model", "dummy:tiny",
         "--workers", "1", "--port", str(port), "--dtype", "float32", "--max-restarts", "0",
         "--ray-address", ray.get_runtime_context().gcs_address, "--cpus-per-worker", "0",
         "--ray-device", "cpu"],
        stdout=subprocess.PIPE, stderr=err.open("w"), text=True,
    )  # fmt: skip
    try:
        ready = ready_line(proc, "radixmesh cluster ready (ray)")
        (worker,) = re.findall(r"[0-9.]+:(\d+)", ready.split("workers", 1)[1].split(", worker")[0])
        os.kill(_worker_pid(worker), signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
        lines = [line for line in err.read_text().splitlines() if line.startswith("radixmesh:")]
        assert lines == [
            "radixmesh: error: worker-0 is dead for good (max_restarts 0 used up); "
            "0 worker(s) left",
            "radixmesh: no worker left; stopping the cluster",
        ]
        assert refuses(f"127.0.0.1:{port}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_launch_spec_checks_its_ray_fields() -> None:
    with pytest.raises(InvalidArgument, match="workers: must be >= 1, got 0"):
        LaunchSpec(model="dummy:tiny", workers=0, ray=RayOptions())
    with pytest.raises(InvalidArgument, match="tp_size: must be >= 1, got 0"):
        LaunchSpec(model="dummy:tiny", tp_size=0, ray=RayOptions())
    with pytest.raises(InvalidArgument, match="device: must be one of"):
        LaunchSpec(model="dummy:tiny", device="tpu", ray=RayOptions())
    with pytest.raises(InvalidArgument, match="ray_max_restarts: must be >= -1, got -2"):
        LaunchSpec(model="dummy:tiny", ray=RayOptions(ray_max_restarts=-2))
    with pytest.raises(InvalidArgument, match="placement_strategy: must be one of"):
        LaunchSpec(model="dummy:tiny", ray=RayOptions(placement_strategy="SPREAD"))
    with pytest.raises(InvalidArgument, match="router_placement: must be one of"):
        LaunchSpec(model="dummy:tiny", ray=RayOptions(router_placement="each"))
    with pytest.raises(InvalidArgument, match="router_cpus: must be > 0 with router_placement"):
        LaunchSpec(model="dummy:tiny", ray=RayOptions(router_placement="spread"))
    with pytest.raises(InvalidArgument, match="routers: must be >= 1, got 0"):
        LaunchSpec(model="dummy:tiny", routers=0, ray=RayOptions())
    with pytest.raises(InvalidArgument, match=r"worker_metrics_port: must be in 1\.\.65535, got 0"):
        LaunchSpec(model="dummy:tiny", ray=RayOptions(worker_metrics_port=0))
    with pytest.raises(InvalidArgument, match="worker_args: set the workers' metrics port with"):
        LaunchSpec(model="dummy:tiny", worker_args=("--metrics-port=9091",), ray=RayOptions())
    with pytest.raises(InvalidArgument, match="policy: must be one of"):
        LaunchSpec(model="dummy:tiny", policy="nope", ray=RayOptions())
    with pytest.raises(InvalidArgument, match="router_options: set 'port' on the launch"):
        LaunchSpec(model="dummy:tiny", router_options={"port": 1}, ray=RayOptions())
    with pytest.raises(InvalidArgument, match="health_interval: must be > 0"):
        LaunchSpec(model="dummy:tiny", router_options={"health_interval": 0.0}, ray=RayOptions())


def test_placement_bundles_and_addresses() -> None:
    assert bundles(2, use_gpu=True, cpus_per_rank=1.0) == [
        {"GPU": 1.0, "CPU": 1.0},
        {"GPU": 1.0, "CPU": 1.0},
    ]
    assert bundles(4, use_gpu=True, cpus_per_rank=0.0) == [{"GPU": 1.0}] * 4
    assert bundles(2, use_gpu=False, cpus_per_rank=2.0) == [{"CPU": 2.0}, {"CPU": 2.0}]
    assert rank_resources(True, 1.0) == {"num_gpus": 1.0, "num_cpus": 1.0}
    assert rank_resources(False, 0.5) == {"num_cpus": 0.5}
    assert advertised_host("0.0.0.0", "10.1.2.3") == "10.1.2.3"
    assert advertised_host("127.0.0.1", "10.1.2.3") == "127.0.0.1"
    # Routers' metrics ports: the configured one plus the routers before on that host.
    assert [host_rank(["a", "a", "b", "a"], i) for i in range(4)] == [0, 1, 0, 2]
    assert [host_rank(["a", "b"], i) for i in range(2)] == [0, 0]


def test_launch_ray_without_ray_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from radixmesh.cluster.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main(["launch", "--model", "dummy:tiny", "--ray"]) == 2
    assert capsys.readouterr().err == (
        "radixmesh: error: ray_address: Ray mode needs Ray: pip install 'radixmesh[ray]'\n"
    )
