"""The `programs` workload: the language's programs (bench/programs.py) through a
`RuntimeEndpoint` on the router, arriving as the load spec says.

A program is the unit here (its gens, forks and selects are several requests), so the
summary is programs/s and program latency percentiles, with the hit rate the endpoint
counted over every request the programs made, overall and per worker.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.serving.report import _stats
from bench.serving.runner import LoadSpec


def run_programs(router: str, args: argparse.Namespace, spec: LoadSpec) -> dict[str, Any]:
    import radixmesh as sgl
    from bench.programs import PROGRAMS

    names = args.programs.split(",")
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        raise ValueError(f"programs: unknown {unknown}; choose from {sorted(PROGRAMS)}")
    endpoint = sgl.RuntimeEndpoint(router, max_concurrency=max(spec.max_concurrency or 64, 4))
    try:
        for name in names:  # warm-up: one of each (grammar backends, first compiles)
            PROGRAMS[name].run(i=0, backend=endpoint, temperature=0)
        before = endpoint.usage.snapshot()
        latencies, errors, duration = asyncio.run(_arrivals(endpoint, names, args, spec))
        after = endpoint.usage.snapshot()
    finally:
        endpoint.shutdown()
    hits = {w: _delta(before.get(w), u) for w, u in after.items()}
    total = hits.pop("total")
    return {
        "workload": "programs",
        "workload_params": {"programs": names, "count": args.num_requests},
        "backend": "runtime-endpoint",
        "load": spec.label,
        "request_rate": None if spec.request_rate == float("inf") else spec.request_rate,
        "max_concurrency": spec.max_concurrency,
        "rate_achieved": len(latencies) / duration if duration else 0.0,
        "summary": {
            "programs": args.num_requests,
            "completed": len(latencies),
            "failures": dict(Counter(errors)),
            "duration_s": duration,
            "programs_per_s": len(latencies) / duration if duration else 0.0,
            "e2e_ms": _stats(latencies),
            "cache": total,
            "per_worker": hits,
        },
    }


async def _arrivals(
    endpoint: Any, names: list[str], args: argparse.Namespace, spec: LoadSpec
) -> tuple[list[float], list[str], float]:
    from bench.programs import PROGRAMS

    rng = random.Random(spec.seed)
    gate = asyncio.Semaphore(spec.max_concurrency or args.num_requests)
    latencies: list[float] = []
    errors: list[str] = []

    def one(i: int) -> None:
        t = time.perf_counter()
        state = PROGRAMS[names[i % len(names)]].run(i=i, backend=endpoint, temperature=0)
        if state.error() is not None:
            errors.append(type(state.error()).__name__)
        else:
            latencies.append(time.perf_counter() - t)

    # Programs block (the language's run is synchronous): one thread each, as many as may
    # run at once (asyncio's default executor would cap them at a few per core).
    pool = ThreadPoolExecutor(spec.max_concurrency or args.num_requests)
    loop = asyncio.get_running_loop()

    async def program(i: int) -> None:
        async with gate:
            await loop.run_in_executor(pool, one, i)

    started = time.perf_counter()
    tasks = []
    for i in range(args.num_requests):
        if i and spec.request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(spec.request_rate))
        tasks.append(asyncio.create_task(program(i)))
    await asyncio.gather(*tasks)
    pool.shutdown()
    return latencies, errors, time.perf_counter() - started


def _delta(before: Any, after: Any) -> dict[str, Any]:
    prompt = after.prompt_tokens - (before.prompt_tokens if before else 0)
    cached = after.cached_tokens - (before.cached_tokens if before else 0)
    requests = after.requests - (before.requests if before else 0)
    return {
        "requests": requests,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
    }


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        f"{'programs':<14} {'policy':<13} {'load':>10} {'done':>6} {'prog/s':>8} "
        f"{'E2E p50':>9} {'E2E p99':>9} {'hit':>5}"
    ]
    for run in runs:
        s = run["summary"]
        lines.append(
            f"{'programs':<14} {run['policy'][:13]:<13} {run['load'][:10]:>10} "
            f"{s['completed']:>3}/{s['programs']:<3} {s['programs_per_s']:>7.2f} "
            f"{s['e2e_ms']['p50']:>7.0f}ms {s['e2e_ms']['p99']:>7.0f}ms "
            f"{s['cache']['hit_rate']:>5.0%}"
        )
    return "\n".join(lines)
