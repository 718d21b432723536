"""bench/serve.py against a real local cluster: 2 workers serving the bundled model on
CPU, a router with its OpenAI HTTP API, real HTTP and gRPC clients."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import serve
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec

# A small KV pool per worker (1,500 tokens) under a shared-prefix set of 6 x 300 tokens:
# one worker cannot hold every prefix, so where the router sends each group decides hits.
WORKER_ARGS = ("--kv-cache-tokens", "1500", "--max-running-requests", "8")
SHARED = [
    "--workload",
    "shared-prefix",
    "--groups",
    "6",
    "--num-requests",
    "30",
    "--prefix-len",
    "300",
    "--question-len",
    "16",
    "--output-len",
    "4",
    "--rates",
    "8",
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalCluster, serve.Target]]:
    http_port = free_port()
    config = LaunchSpec(
        model="smollm2",
        workers=2,
        port=free_port(),
        worker_args=WORKER_ARGS,
        router_options={"http_port": http_port},
    )
    with LocalCluster(config) as c:
        target = serve.Target(
            grpc=c.address,
            http=f"http://127.0.0.1:{http_port}",
            model=serve._served_model(c.address),
            workers=c.worker_addresses,
            policy="cache_aware",
            worker_key=c.worker_key,
        )
        yield c, target


def _runs(target: serve.Target, argv: list[str]) -> list[dict[str, Any]]:
    args = serve.parse_args(["--grpc", target.grpc, "--warmup", "2", *argv])
    return serve.run_all(target, args)


def test_cache_aware_beats_round_robin_on_shared_prefixes(
    cluster: tuple[LocalCluster, serve.Target],
) -> None:
    c, target = cluster
    by_policy = {}
    for policy in ("cache_aware", "round_robin"):
        if policy != target.policy:
            c.replace_router(policy)
            target.policy = policy
        [run] = _runs(target, SHARED)
        by_policy[policy] = run["summary"]
    c.replace_router("cache_aware")
    target.policy = "cache_aware"
    ca, rr = by_policy["cache_aware"], by_policy["round_robin"]
    for s in (ca, rr):
        assert (s["requests"], s["completed"], s["failures"]) == (30, 30, {})
        assert s["output_tokens"] == 30 * 4
        assert set(s["per_worker"]) == {"worker-0", "worker-1"}
        assert s["ttft_ms"]["p50"] > 0 and s["itl_ms"]["p50"] > 0
    assert ca["cache"]["hit_rate"] > 0
    assert ca["cache"]["hit_rate"] > rr["cache"]["hit_rate"]
    assert ca["cache"]["of_ideal"] >= 0.8


def test_multi_turn_over_grpc_resends_history_that_hits(
    cluster: tuple[LocalCluster, serve.Target],
) -> None:
    _, target = cluster
    argv = [
        "--backend",
        "grpc",
        "--workload",
        "multi-turn",
        "--num-requests",
        "12",
        "--turns",
        "3",
        "--prefix-len",
        "64",
        "--question-len",
        "12",
        "--output-len",
        "4",
        "--think-time",
        "0.05",
        "--concurrency",
        "4",
    ]
    [run] = _runs(target, argv)
    s = run["summary"]
    assert (s["requests"], s["completed"], s["failures"]) == (12, 12, {})
    assert s["cache"]["hit_rate"] > 0.3  # later turns resend their history
    assert run["load"] == "inf/s c=4"


def test_random_and_programs_and_the_files_written(
    cluster: tuple[LocalCluster, serve.Target], tmp_path: Path
) -> None:
    _, target = cluster
    argv = [
        "--grpc",
        target.grpc,
        "--http",
        target.http,
        "--workload",
        "random,programs",
        "--num-requests",
        "8",
        "--input-len",
        "20-60",
        "--output-len",
        "4-8",
        "--programs",
        "judge_3,tips_fork5",
        "--rates",
        "inf",
        "--warmup",
        "1",
        "--name",
        "test",
        "--out-dir",
        str(tmp_path),
    ]
    result = serve.main(argv)
    random_run, programs_run = result["runs"]
    s = random_run["summary"]
    assert (s["requests"], s["completed"], s["failures"]) == (8, 8, {})
    assert 8 * 4 <= s["output_tokens"] <= 8 * 8
    assert s["cache"]["ideal_hit_rate"] == 0.0
    p = programs_run["summary"]
    assert (p["programs"], p["completed"], p["failures"]) == (8, 8, {})
    assert p["cache"]["requests"] > 8  # forks and selects: several requests a program
    saved = json.loads((tmp_path / "serve-test.json").read_text())
    assert [r["workload"] for r in saved["runs"]] == ["random", "programs"]
    assert saved["machine"]["cores"] >= 1
    for name in ("serve-test-latency.png", "serve-test-hits.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def test_launch_spec_shares_one_gpu_between_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--workers-per-gpu K`: K workers on CUDA sharing each GPU, each told to take 1/K of
    its memory; the first of `--policies` with its router options."""
    from radixmesh.cluster.launch import worker_args, worker_gpu_env

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    plain = serve.launch_spec(serve.parse_args(["--launch"]), port=50000, http_port=8000)
    assert (plain.device, plain.workers_per_gpu, plain.gpus_per_worker) == ("auto", 1, 0)
    argv = ["--launch", "--model", "dummy:tiny", "--workers", "4", "--workers-per-gpu", "4"]
    argv += ["--policies", "cache_aware:hot_prefix_replication=true,cache_aware"]
    spec = serve.launch_spec(serve.parse_args(argv), port=50000, http_port=8000)
    assert (spec.device, spec.workers_per_gpu, spec.gpus_per_worker) == ("cuda", 4, 1)
    assert spec.router_options == {"http_port": 8000, "hot_prefix_replication": True}
    assert worker_args(spec)[:2] == ("--gpu-memory-share", "0.250000")
    envs = [worker_gpu_env(spec, i) or {} for i in range(4)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3"] * 4
