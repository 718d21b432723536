"""The load from several client processes: one Python process drives about 30-40k
streamed tokens a second at most, less than a cluster of small workers serves, so a run
that measures the router tier against going direct must not be bound by its own client.

The sessions are dealt round robin to `procs` processes (spawned, each with its own
backend and event loop), each with its share of the concurrency and the rate; all start
at one agreed moment (time.monotonic() is one clock for every process of a machine), and
their results are joined as one run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from bench.serving.clients import RequestResult, make_backend
from bench.serving.runner import LoadSpec, RunResult, run_load
from bench.serving.workloads import Workload

START_DELAY_S = 5.0  # for the processes to start and import before the agreed moment


def run_load_in_procs(
    workload: Workload, backend_args: dict[str, Any], spec: LoadSpec, procs: int
) -> RunResult:
    """`run_load` over `procs` processes; `backend_args` are `make_backend`'s."""
    if procs < 1:
        raise ValueError(f"procs: must be >= 1, got {procs}")
    parts = [
        dataclasses.replace(workload, sessions=workload.sessions[i::procs]) for i in range(procs)
    ]
    parts = [p for p in parts if p.sessions]
    cap = spec.max_concurrency
    child_spec = LoadSpec(
        request_rate=spec.request_rate / len(parts),
        max_concurrency=None if cap is None else math.ceil(cap / len(parts)),
        seed=spec.seed,
    )
    start_at = time.monotonic() + START_DELAY_S
    with ProcessPoolExecutor(len(parts), mp_context=mp.get_context("spawn")) as pool:
        futures = [
            pool.submit(
                _child, part, backend_args, dataclasses.replace(child_spec, seed=i), start_at
            )
            for i, part in enumerate(parts)
        ]
        outs = [f.result() for f in futures]
    results = [r for rs, _ in outs for r in rs]
    return RunResult(results=results, duration=max(end for _, end in outs) - start_at)


def _child(
    part: Workload, backend_args: dict[str, Any], spec: LoadSpec, start_at: float
) -> tuple[list[RequestResult], float]:
    async def main() -> tuple[list[RequestResult], float]:
        backend = make_backend(**backend_args)
        try:
            await asyncio.sleep(max(start_at - time.monotonic(), 0.0))
            run = await run_load(part, backend, spec)
        finally:
            await backend.close()
        return run.results, time.monotonic()

    return asyncio.run(main())
