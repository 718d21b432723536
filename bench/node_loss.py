"""A Ray node lost under a steady load: how many requests are lost, and how long until the
cluster is whole again (Ray mode, `worker_placement` spread, dummy:tiny on CPU).

Three raylets of this machine (`ray.cluster_utils.Cluster`), six workers spread two a node
by one SPREAD placement group, the router on the head. Clients that never retry send
generations in a loop; one non-head node is then removed without grace (its raylet
SIGKILLed). The timeline, from the removal: the router sees the lost workers down, Ray
declares the node dead and restarts their actors on the survivors (the router follows
them to their new addresses), and every worker serves again with its summary resynced.
How soon Ray declares a node dead is its GCS health check (`--health-check-period-ms`
and `--health-check-failures`; Ray's defaults are 3000 ms and 5).

    python -m bench.node_loss                                  # Ray's defaults
    python -m bench.node_loss --health-check-period-ms 1000 --health-check-failures 3 \\
        --name fast-detection
"""

from __future__ import annotations

import argparse
import fcntl
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import record

BENCHMARK = "node_loss"
PARAMS = {"temperature": 0.0, "ignore_eos": True}
WORKER_ARGS = ("--dtype", "float32", "--event-block-size", "16")


class Load:
    """Clients sending generations in a loop (no client-side retry); each outcome kept."""

    def __init__(self, address: str, threads: int, new_tokens: int) -> None:
        self.address, self.new_tokens = address, new_tokens
        self.done: list[tuple[float, float, int]] = []  # sent, ended, tokens
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(k,)) for k in range(threads)]

    def _run(self, k: int) -> None:
        from radixmesh.client import Client

        params = {**PARAMS, "max_new_tokens": self.new_tokens}
        with Client(self.address, max_retries=0, timeout=120) as client:
            i = 0
            while not self.stop.is_set():
                ids = [3 + (k * 50 + i) % 500, 5, 9, 200 + k, 31, 7] * 4
                sent = time.monotonic()
                try:
                    out = client.generate(input_ids=ids, sampling_params=params)
                    self.done.append((sent, time.monotonic(), len(out.token_ids)))
                except Exception as e:
                    self.errors.append(repr(e))
                i += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def timeline(
    cluster: Any, doomed: list[str], before: dict[str, Any], lost_at: float
) -> dict[str, float]:
    """Seconds from the loss to: the router seeing every lost worker down, every lost
    worker at a new address (its actor restarted), every worker healthy and resynced."""
    import ray

    marks: dict[str, float] = {}
    while "whole" not in marks:
        now = ray.get(cluster.router.summaries.remote())
        t = round(time.monotonic() - lost_at, 2)
        if all(not now[w]["healthy"] for w in doomed):
            marks.setdefault("down", t)
        if all(now[w]["address"] != before[w]["address"] for w in doomed):
            marks.setdefault("restarted", t)
            if all(s["healthy"] and s["epoch"] != 0 for s in now.values()):
                marks["whole"] = t
        if t > 300:
            raise TimeoutError(f"not whole again after 300 s: {marks}")
        time.sleep(0.1)
    return marks


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from radixmesh.cluster.launch import free_port
    from radixmesh.cluster.ray_launch import RayCluster
    from radixmesh.cluster.spec import LaunchSpec, RayOptions

    os.environ.setdefault("RAY_worker_niceness", "0")
    system = {
        "health_check_period_ms": args.health_check_period_ms,
        "health_check_failure_threshold": args.health_check_failures,
    }
    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "include_dashboard": False, "_system_config": system},
    )
    try:
        for _ in range(2):
            nodes.add_node(num_cpus=2)
        nodes.wait_for_nodes()
        ray.init(address=nodes.address, log_to_driver=False)
        config = LaunchSpec(
            model="dummy:tiny", workers=args.workers, port=free_port(), device="cpu",
            worker_args=WORKER_ARGS, router_options={"health_interval": 0.2, "seed": 0},
            ray=RayOptions(cpus_per_worker=0.5, worker_placement="spread"),
        )  # fmt: skip
        with RayCluster(config) as cluster:
            lost = next(iter(nodes.worker_nodes))
            doomed = [
                f"worker-{i}" for i, n in enumerate(cluster.worker_nodes()) if n == lost.node_id
            ]
            before = dict(ray.get(cluster.router.summaries.remote()))
            with Load(cluster.address, args.threads, args.new_tokens) as load:
                time.sleep(args.warmup)
                lost_at = time.monotonic()
                nodes.remove_node(lost, allow_graceful=False)
                marks = timeline(cluster, doomed, before, lost_at)
                time.sleep(args.warmup)
        ends = sorted(end for _, end, _ in load.done if end > lost_at)
        gaps = [b - a for a, b in zip([lost_at, *ends], ends, strict=False)]
        return {
            "workers": args.workers,
            "lost_workers": len(doomed),
            "requests": len(load.done) + len(load.errors),
            "requests_lost": len(load.errors),
            "short_outputs": sum(1 for *_, n in load.done if n != args.new_tokens),
            "seconds_to_down": marks["down"],
            "seconds_to_restarted": marks["restarted"],
            "seconds_to_whole": marks["whole"],
            "longest_gap_between_answers_s": round(max(gaps), 2),
            "errors": load.errors[:5],
        }
    finally:
        ray.shutdown()
        nodes.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--threads", type=int, default=6, help="clients sending in a loop")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the loss")
    ap.add_argument("--health-check-period-ms", type=int, default=3000)
    ap.add_argument("--health-check-failures", type=int, default=5)
    record.add_output_arguments(ap)
    args = ap.parse_args()
    # One Ray on the machine at a time: the Ray tests' lock (tests/cluster/conftest.py).
    lock = Path(tempfile.gettempdir()) / "radixmesh-tests-ray.lock"
    with lock.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        figures = run(args)
    rows = [(k, v) for k, v in figures.items() if k != "errors"]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    record.write(BENCHMARK, args, figures)


if __name__ == "__main__":
    main()
