"""The online serving benchmark: a cluster (router + workers) under load over time.

Sends a seeded workload (`random`, `shared-prefix`, `multi-turn`, or the language's
`programs`) to a router's OpenAI HTTP API (`--backend openai-completions` / `openai-chat`)
or its gRPC API (`--backend grpc`), open loop at each `--rates` value (Poisson arrivals)
or at a fixed `--concurrency`, and reports per run what SGLang's `bench_serving` reports:
request and token throughput, TTFT / ITL / TPOT / E2E percentiles, goodput under an SLO,
the cache hit rate (overall, per worker, and against the trace's ideal) and failures by
kind. Prints a table; writes JSON and two plots (latency against request rate; per-worker
hit rate over time) to `--out-dir` (bench/results by default).

Against a running router:
    python -m bench.serve --grpc localhost:50050 --http http://localhost:8000 \\
        --workload shared-prefix --rates 2,4,8
Or start a local cluster and compare routing policies on the same workers (the router is
restarted per policy; worker caches are flushed before every run):
    python -m bench.serve --launch --model smollm2 --workers 2 \\
        --policies cache_aware,round_robin --workload shared-prefix --rates 2,4
`--backend` takes a list: `grpc` (streamed) and `grpc-unary` through the router, and
`grpc-direct` / `grpc-unary-direct`, the same load spread straight over every worker (the
router tier's own cost is the difference); `--client-procs N` sends it from N processes, so
that the client is not what bounds a fast cluster. Every run records the router tier's CPU time
(psutil over its processes: `--launch`'s routers, or `--router-pids`) per 1,000 output
tokens beside the throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import record
from bench.serving import offline, programs, report
from bench.serving.clients import BACKENDS, make_backend
from bench.serving.procs import run_load_in_procs
from bench.serving.runner import LoadSpec, run_load
from bench.serving.workloads import (
    Mode,
    Workload,
    describe,
    multi_turn_workload,
    random_workload,
    shared_prefix_workload,
    warmup_workload,
)

if TYPE_CHECKING:
    from radixmesh.cluster.spec import LaunchSpec

RESULTS = record.RESULTS
WORKLOAD_NAMES = ("random", "shared-prefix", "multi-turn", "programs")


@dataclass
class Target:
    """Where the load goes: the router's gRPC address, its HTTP base URL, the model."""

    grpc: str
    http: str
    model: str
    workers: list[str]  # worker gRPC addresses (known when launched here)
    policy: str
    worker_key: str | None = None  # the key those workers require
    router_pids: list[int] = field(default_factory=list)  # the router tier's processes


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used (those gone count 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def _rates(text: str) -> list[float]:
    return [float("inf") if r == "inf" else float(r) for r in text.split(",") if r]


def build_workload(name: str, args: argparse.Namespace, mode: Mode, tokenizer: Any) -> Workload:
    common = {"mode": mode, "seed": args.seed, "tokenizer": tokenizer}
    if name == "random":
        return random_workload(
            num_requests=args.num_requests,
            input_len=_range(args.input_len),
            output_len=_range(args.output_len),
            **common,
        )
    if name == "shared-prefix":
        per_group = max(args.num_requests // args.groups, 1)
        return shared_prefix_workload(
            num_groups=args.groups,
            requests_per_group=per_group,
            prefix_len=args.prefix_len,
            question_len=args.question_len,
            output_len=_range(args.output_len)[1],
            hot_share=args.hot_share,
            **common,
        )
    if name == "multi-turn":
        return multi_turn_workload(
            num_conversations=max(args.num_requests // args.turns, 1),
            turns=args.turns,
            system_len=args.prefix_len,
            message_len=args.question_len,
            output_len=_range(args.output_len)[1],
            think_time=args.think_time,
            **common,
        )
    raise ValueError(f"workload: unknown {name!r}; choose from {', '.join(WORKLOAD_NAMES)}")


def _mode(args: argparse.Namespace, model: str) -> Mode:
    if args.mode != "auto":
        return args.mode
    return "ids" if model.startswith("dummy:") else "text"


def _tokenizer(target: Target) -> Any:
    from radixmesh.client import Client
    from radixmesh.tokenizer import tokenizer_for

    with Client(target.grpc) as c:
        info = c.model_info()
    return tokenizer_for(
        info.tokenizer,
        vocab_size=info.vocab_size,
        eos_token_ids=info.eos_token_ids,
        bos_token_id=info.bos_token_id,
    )


def flush(target: Target) -> None:
    """Empty every worker's cache (so each run starts cold), waiting out requests that a
    finished run may still be unwinding."""
    from radixmesh.client import Client

    for address in target.workers or [target.grpc]:
        with Client(address, api_key=target.worker_key if target.workers else None) as c:
            deadline = time.monotonic() + 30
            while not c.flush_cache() and time.monotonic() < deadline:
                time.sleep(0.2)


async def _one_run(
    workload: Workload, target: Target, args: argparse.Namespace, spec: LoadSpec, name: str
) -> dict[str, Any]:
    direct = name.endswith("-direct")
    if direct and not target.workers:
        raise ValueError(f"backend: {name} needs --launch (it sends to the workers)")
    backend_args: dict[str, Any] = {
        "name": name,
        "http_url": target.http,
        "grpc_target": target.grpc,
        "model": target.model,
        "api_key": target.worker_key if direct else None,
        "workers": target.workers,
        "connections": args.connections,
    }
    backend = make_backend(**backend_args)
    try:
        if args.warmup:
            # The workload's own prompt lengths, at once: the first timed requests must not
            # pay for compiling the kernels of new shapes (hundreds of ms a shape on a GPU).
            warm = warmup_workload(
                workload, args.warmup, seed=args.seed + 1, tokenizer=_tokenizer(target)
            )
            await run_load(warm, backend, LoadSpec())
            await asyncio.to_thread(flush, target)
        cpu_before = cpu_seconds(target.router_pids)
        if args.client_procs > 1:
            run = await asyncio.to_thread(
                run_load_in_procs, workload, backend_args, spec, args.client_procs
            )
        else:
            run = await run_load(workload, backend, spec)
        router_cpu = cpu_seconds(target.router_pids) - cpu_before
    finally:
        await backend.close()
    slo = report.Slo(args.slo_ttft, args.slo_tpot)
    summary = report.summarize(run.results, run.duration, slo)
    summary["router_cpu_s"] = router_cpu
    out_tokens = summary["output_tokens"]
    summary["router_cpu_s_per_1k_tokens"] = 1000 * router_cpu / out_tokens if out_tokens else 0.0
    return {
        "workload": workload.name,
        "workload_params": workload.params,
        "policy": "direct" if direct else target.policy,
        "backend": name,
        "load": spec.label,
        "request_rate": None if spec.request_rate == float("inf") else spec.request_rate,
        "max_concurrency": spec.max_concurrency,
        "rate_achieved": summary["request_throughput"],
        "summary": summary,
        "hit_timeline": report.hit_rate_timeline(run.results, run.duration),
    }


def run_all(target: Target, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every workload at every load against one router (one policy)."""
    runs = []
    specs = [
        LoadSpec(request_rate=r, max_concurrency=c, seed=args.seed)
        for r in _rates(args.rates)
        for c in ([int(x) for x in args.concurrency.split(",")] if args.concurrency else [None])
    ]
    for name in args.workload.split(","):
        for spec in specs:
            flush(target)
            if name == "programs":
                run = programs.run_programs(target.grpc, args, spec)
                run["policy"] = target.policy
                runs.append(run)
                print(tables([run]).splitlines()[1], flush=True)
                continue
            mode = _mode(args, target.model)
            workload = build_workload(name, args, mode, _tokenizer(target))
            for i, backend in enumerate(args.backend.split(",")):
                if i:
                    flush(target)  # each backend's run starts as cold as the first
                print(f"{target.policy} {backend}: {describe([workload])}, {spec.label}")
                run = asyncio.run(_one_run(workload, target, args, spec, backend))
                runs.append(run)
                print(tables([run]).splitlines()[1], flush=True)
    return runs


@contextmanager
def launched(args: argparse.Namespace) -> Iterator[tuple[Any, Target]]:
    """A local cluster as `--model`, `--workers`, `--worker-args` say, with HTTP."""
    from radixmesh.cluster.launch import LocalCluster, free_port

    http_port = free_port()
    config = launch_spec(args, port=free_port(), http_port=http_port)
    with LocalCluster(config) as cluster:
        target = Target(
            grpc=cluster.address,
            http=f"http://127.0.0.1:{http_port}",
            model=_served_model(cluster.address),
            workers=cluster.worker_addresses,
            policy=args.policies.split(",")[0],
            worker_key=cluster.worker_key,
            router_pids=[p.pid for p in cluster.routers],
        )
        yield cluster, target


def launch_spec(args: argparse.Namespace, port: int, http_port: int) -> LaunchSpec:
    """The `LaunchSpec` of `--launch`: the first of `--policies` with its router options;
    on CUDA with `--gpus-per-worker` (each worker's own GPUs) or `--workers-per-gpu` (K
    workers sharing each GPU, each taking 1/K of its memory, as `radixmesh launch` does)."""
    import shlex

    from radixmesh.cluster.spec import LaunchSpec

    policy, options = _policy(args.policies.split(",")[0])
    cuda = args.gpus_per_worker > 0 or args.workers_per_gpu > 1
    visible = None
    if cuda and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        import torch

        visible = torch.cuda.device_count()  # the launcher's count, as `launch` takes it
    return LaunchSpec(
        model=args.model,
        workers=args.workers,
        routers=args.routers,
        policy=policy,
        port=port,
        tp_size=max(args.gpus_per_worker, 1),
        device="cuda" if cuda else "auto",
        workers_per_gpu=args.workers_per_gpu,
        visible_gpus=visible,
        worker_args=tuple(shlex.split(args.worker_args)),
        router_options={"http_port": http_port, **options},
        ready_timeout=args.ready_timeout,
    )


def _policy(spec: str) -> tuple[str, dict[str, Any]]:
    """`--policies` entry: a policy name, with router options after a colon
    (`cache_aware:host_hit_cost=1.0;request_cost_tokens=32`), values as numbers (true /
    false: a switch, `cache_aware:hot_prefix_replication=true`)."""
    name, _, opts = spec.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, opts.split(";")):
        key, _, value = item.partition("=")
        if value in ("true", "false"):
            options[key] = value == "true"
        else:
            options[key] = float(value) if "." in value else int(value)
    return name, options


def _wait_serving(address: str, timeout: float) -> None:
    """Until the router or worker at `address` says SERVING (a model may still be loading)."""
    from radixmesh.client import Client

    deadline = time.monotonic() + timeout
    with Client(address) as c:
        while not c.health(timeout=2.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} did not serve within {timeout:.0f} s")
            time.sleep(0.5)


def _served_model(address: str) -> str:
    from radixmesh.client import Client

    with Client(address) as c:
        return c.model_info().model


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    runs: list[dict[str, Any]] = []
    started = record.now()
    if args.offline:
        runs = run_offline_all(args)
    elif args.launch:
        with launched(args) as (cluster, target):
            for i, policy in enumerate(args.policies.split(",")):
                if i:
                    cluster.replace_router(*_policy(policy))
                    target.policy = policy
                    target.router_pids = [p.pid for p in cluster.routers]
                runs += run_all(target, args)
                write(args, runs, started, plots=False)  # a run cut short keeps these
    else:
        _wait_serving(args.grpc, args.ready_timeout)
        model = _served_model(args.grpc)
        workers = [a for a in args.workers_at.split(",") if a]
        target = Target(args.grpc, args.http or "", model, workers, args.policies.split(",")[0])
        target.worker_key = os.environ.get("RADIXMESH_WORKER_API_KEY")
        target.router_pids = [int(p) for p in args.router_pids.split(",") if p]
        runs = run_all(target, args)
    result = write(args, runs, started)
    print()
    print(tables(runs))
    return result


def tables(runs: list[dict[str, Any]]) -> str:
    if all(r["policy"] == "offline" for r in runs):
        return "\n".join(
            f"offline {r['workload']}: {r['summary']['output_throughput']:.0f} output tok/s"
            for r in runs
        )
    plain = [r for r in runs if r["workload"] != "programs"]
    progs = [r for r in runs if r["workload"] == "programs"]
    parts = [report.table(plain)] if plain else []
    return "\n".join(parts + ([programs.table(progs)] if progs else []))


def run_offline_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each workload on an in-process Engine (`--worker-args` as its options)."""
    from radixmesh.worker.model.loader import load_tokenizer

    mode = _mode(args, args.model)
    tokenizer = load_tokenizer(args.model)
    runs = []
    for name in args.workload.split(","):
        workload = build_workload(name, args, mode, tokenizer)
        print(f"offline engine: {describe([workload])}", flush=True)
        runs.append(offline.run_offline(args.model, args.worker_args, workload, args.repeats))
        s = runs[-1]["summary"]
        print(
            f"offline {name}: {s['request_throughput']:.2f} req/s, "
            f"{s['output_throughput']:.0f} output tok/s",
            flush=True,
        )
    return runs


def write(
    args: argparse.Namespace, runs: list[dict[str, Any]], started: str, plots: bool = True
) -> dict[str, Any]:
    """The JSON record of `runs` (and, with `plots`, the latency and hit-rate plots)."""
    import aiohttp  # noqa: F401  (its version goes in the record)
    import grpc  # noqa: F401

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"serve-{args.name}"
    result = {**record.header("serve", args, started), "runs": runs}
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    plain = [r for r in runs if r["workload"] != "programs" and r["policy"] != "offline"]
    plain = plain if plots else []
    if plain:
        report.plot_latency(plain, out_dir / f"{stem}-latency.png")
        report.plot_hit_timeline(plain, out_dir / f"{stem}-hits.png")
    print(f"wrote {out_dir / stem}.json" + (" and its plots" if plain else ""))
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = ap.add_argument_group("where")
    where.add_argument("--launch", action="store_true", help="start a local cluster here")
    where.add_argument(
        "--offline",
        action="store_true",
        help="no cluster: the workload on an in-process Engine (--model, --worker-args)",
    )
    where.add_argument("--grpc", default=None, help="a running router's gRPC address")
    where.add_argument("--http", default=None, help="a running router's HTTP base URL")
    where.add_argument("--model", default="smollm2", help="with --launch")
    where.add_argument("--workers", type=int, default=2, help="with --launch")
    where.add_argument("--routers", type=int, default=1, help="with --launch: router replicas")
    where.add_argument(
        "--router-pids", default="", help="without --launch: the routers' pids (CPU time)"
    )
    where.add_argument(
        "--workers-at",
        default="",
        help="without --launch: the workers' addresses, for the -direct backends (their key "
        "in $RADIXMESH_WORKER_API_KEY)",
    )
    where.add_argument("--worker-args", default="", help="with --launch: `radixmesh worker` flags")
    where.add_argument(
        "--gpus-per-worker",
        type=int,
        default=0,
        help="with --launch: each worker's own GPUs (its TP size); 0: they share the visible ones",
    )
    where.add_argument(
        "--workers-per-gpu",
        type=int,
        default=1,
        help="with --launch: workers sharing each GPU (on CUDA; each is told to take 1/K of "
        "its memory, --gpu-memory-share)",
    )
    where.add_argument(
        "--policies",
        default="cache_aware",
        help="with --launch: one run each; NAME or NAME:OPTION=VALUE;... (router options, "
        "e.g. cache_aware:host_hit_cost=1.0)",
    )
    where.add_argument("--ready-timeout", type=float, default=600.0)
    load = ap.add_argument_group("load")
    load.add_argument(
        "--backend", default="openai-completions", help=f"any of {', '.join(BACKENDS)}"
    )
    load.add_argument("--workload", default="random", help=f"any of {', '.join(WORKLOAD_NAMES)}")
    load.add_argument(
        "--mode",
        default="auto",
        choices=("auto", "ids", "text"),
        help="prompts as token ids or text (auto: ids for dummy: models)",
    )
    load.add_argument("--rates", default="inf", help="sessions/s, comma-separated; inf: at once")
    load.add_argument("--concurrency", default=None, help="max sessions in flight (list)")
    load.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="client processes sharing the load (one Python process bounds what it sends)",
    )
    load.add_argument(
        "--connections",
        type=int,
        default=1,
        help="gRPC connections per address (router replicas sharing a port each take some)",
    )
    load.add_argument("--num-requests", type=int, default=64)
    load.add_argument("--input-len", default="128-512", help="random: prompt tokens lo-hi")
    load.add_argument("--output-len", default="64-128", help="output tokens lo-hi (ignore_eos)")
    load.add_argument("--groups", type=int, default=8, help="shared-prefix: prefixes")
    load.add_argument("--prefix-len", type=int, default=1024, help="prefix / system tokens")
    load.add_argument(
        "--hot-share", type=float, default=0.0, help="shared-prefix: group 0's share of requests"
    )
    load.add_argument("--question-len", type=int, default=64, help="question / message tokens")
    load.add_argument("--turns", type=int, default=4, help="multi-turn: turns a conversation")
    load.add_argument("--think-time", type=float, default=0.5, help="multi-turn: seconds")
    load.add_argument("--programs", default="tips_fork5,judge_3,multi_turn,few_shot_select")
    load.add_argument(
        "--warmup", type=int, default=16, help="requests shaped like the run's, before it"
    )
    load.add_argument("--repeats", type=int, default=1, help="--offline: runs (the median)")
    load.add_argument("--seed", type=int, default=0)
    out = ap.add_argument_group("report")
    out.add_argument("--slo-ttft", type=float, default=1.0, help="goodput SLO, seconds")
    out.add_argument("--slo-tpot", type=float, default=0.05, help="goodput SLO, seconds")
    out.add_argument("--name", default="run", help="result files: serve-<name>.json/.png")
    out.add_argument("--out-dir", default=str(RESULTS))
    args = ap.parse_args(argv)
    if not args.launch and not args.grpc and not args.offline:
        ap.error("give --launch, --offline or --grpc (and --http for the OpenAI backends)")
    for backend in args.backend.split(","):
        if backend not in BACKENDS:
            ap.error(f"--backend: unknown {backend!r}; choose from {', '.join(BACKENDS)}")
    return args


if __name__ == "__main__":
    main()
