"""A workload on an in-process `Engine`, every request submitted at once: the offline
throughput that serving the same workload through the router is compared with."""

from __future__ import annotations

import shlex
import time
from typing import Any

from bench.serving.workloads import Workload


def engine_options(model: str, worker_args: str) -> dict[str, Any]:
    """`radixmesh worker --model M` + flags as Engine options (the CLI's parser reads them)."""
    from radixmesh.cluster.cli import build_parser
    from radixmesh.cluster.cli import engine_options as options

    args = build_parser().parse_args(["worker", "--model", model, *shlex.split(worker_args)])
    return options(args)


def run_offline(
    model: str, worker_args: str, workload: Workload, repeats: int = 1
) -> dict[str, Any]:
    """Generate every single-turn session of `workload` in one `generate` call, `repeats`
    times (cache flushed before each); the figures are the median run's."""
    from radixmesh.worker.engine import Engine

    if any(len(s.turns) > 1 for s in workload.sessions):
        raise ValueError("workload: offline runs take single-turn workloads")
    turns = [s.turns[0] for s in workload.sessions]
    options = engine_options(model, worker_args)
    with Engine(**options) as engine:
        warm = [t.message for t in turns[:2]]
        _generate(engine, warm, [4] * len(warm))
        runs = []
        for _ in range(repeats):
            engine.flush_cache()
            started = time.perf_counter()
            outs = _generate(engine, [t.message for t in turns], [t.max_tokens for t in turns])
            runs.append(time.perf_counter() - started)
        seconds = sorted(runs)[len(runs) // 2]
        sc = engine.config.scheduler
        resolved = {
            "max_running_requests": sc.max_running_requests,
            "max_num_batched_tokens": sc.max_num_batched_tokens,
            "kv_pool_tokens": engine.worker.allocator.num_usable_slots,
        }
    output = sum(o["meta_info"]["completion_tokens"] for o in outs)
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    return {
        "workload": workload.name,
        "workload_params": workload.params,
        "policy": "offline",
        "backend": "engine",
        "load": "all at once",
        "request_rate": None,
        "max_concurrency": None,
        "rate_achieved": len(outs) / seconds,
        "engine_options": options,
        "engine_resolved": resolved,
        "run_seconds": runs,
        "summary": {
            "requests": len(turns),
            "completed": len(outs),
            "failures": {},
            "duration_s": seconds,
            "request_throughput": len(outs) / seconds,
            "output_throughput": output / seconds,
            "output_tokens": output,
            "cache": {"prompt_tokens": prompt, "cached_tokens": cached},
        },
    }


def _generate(engine: Any, prompts: list[Any], max_tokens: list[int]) -> list[dict[str, Any]]:
    params = [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in max_tokens]
    if isinstance(prompts[0], str):
        out = engine.generate(prompts, params)
    else:
        out = engine.generate(input_ids=prompts, sampling_params=params)
    assert isinstance(out, list)
    return out
