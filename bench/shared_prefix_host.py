"""The host's share of the GPU shared-prefix workload ("P2"): the in-process engine's whole
host path with no model, in seconds per 1,024 requests and the req/s the host alone allows.

P2 is `bench.offline --workloads gpu`'s shared_prefix: 1,024 requests in 16 groups of 64
sharing a 1,536-token prefix, 64 own tokens each, 8 new tokens (greedy, ignore_eos), all
given to one `Engine.generate` call, with bench/engine_gpu.sh's settings (max running
requests 256, max batched tokens 8,192, page size 1, lpm) and the overlap scheduler on
(CUDA's default). On one H200 with dummy:llama-3-8b it runs at 324-346 req/s; the host
work per request (admission, prefix matching and inserts, chunked prefill, the step's
inputs, sampling, the per-token output path, finishing and freeing) is a large part of it.

This runs that call on the CPU with `dummy:tiny` (float32): the Engine (validation,
requests, detokenizers, the inbox and the scheduler thread, the output queues), the
scheduler, the radix cache, allocator and req->token table are the real ones. The model is
not run. Two runners (`--runners`):

  inputs     the worker's own ModelRunner with its model and attention backend stubbed
             out: the step's inputs (ForwardBatch.build, the req->token table's staged
             writes, placeholders), the logit rows and the sampler run; the "model" returns
             zero hidden states and logits whose argmax is token 7. The attention
             backend's `prepare` is skipped (the CPU torch backend's is not the GPU's).
  scheduler  `bench.schedule_overhead.HostOnlyRunner`: no ModelRunner at all (token 7 for
             every sampling row), as bench.output_delivery runs.

Every run checks the outputs (8 tokens of 7 for every request) and that every KV slot is
free or in the tree afterwards, and records the prompt tokens the cache served (each
prefix computed once: 1,548,288; the requests reach the scheduler thread while it steps,
so a call may admit one beside a chunk of its prefix, which then computes the rest
itself). Besides the call's wall time it reports the CPU time of the caller's thread
(validating and building the requests, submitting, collecting) and of the scheduler
thread, and the garbage collector's time in it (in either thread: its collections
traverse every live list, the prompts' 1,600 ids each included).

Before/after: `--tree DIR` runs the same in a subprocess against another checkout's
`radixmesh` (e.g. `git archive REV radixmesh | tar -x -C DIR`), alternating with this
tree's subprocess `--rounds` times (this tree runs in a subprocess too, so that both run
alike); each subprocess warms up, then times `--repeats` calls. The machine may be
shared: noise only adds time, so the best (min) call is the figure to compare, with the
median beside it. `--profile DIR` writes a cProfile of one call's scheduler thread
(the caller's thread is not in it).
Run: `.venv/bin/python -m bench.shared_prefix_host [--tree DIR] [--rounds 3]`.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench import record
from bench.schedule_overhead import (
    BENCH_DIR,
    WORKLOAD_ARGS,
    HostOnlyRunner,
    add_workload_arguments,
    argv_of,
    run_tree,
    shared_prompts,
)
from radixmesh.worker.batch import Batch, ForwardOutput, PendingTokens
from radixmesh.worker.engine import Engine

RUNNERS = ("inputs", "scheduler")
TOKEN = 7  # what every sampled row gets


class _NoModel:
    """The model's two calls: zero hidden states, and logits whose argmax is TOKEN."""

    def __init__(self, hidden: int, vocab: int) -> None:
        self.hidden = hidden
        self.vocab = vocab

    def __call__(self, fb: Any, attn: Any) -> torch.Tensor:
        return torch.zeros(len(fb.input_ids), self.hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(len(hidden), self.vocab)
        logits[:, TOKEN] = 1.0
        return logits


class _NoAttention:
    def prepare(self, fb: Any) -> None:
        pass


class _Parity(HostOnlyRunner):
    """HostOnlyRunner with the model runner's two placeholder ranges, alternating (the
    overlap scheduler holds two steps' placeholders at once)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.parity = 0

    def forward(self, batch: Batch) -> ForwardOutput:
        out = super().forward(batch)
        t = out.tokens
        out.tokens = PendingTokens(t.sample_items, t.ids, t.host, None, 1 + self.parity * self.rows)
        self.parity ^= 1
        return out


def make_engine(args: argparse.Namespace) -> Engine:
    tokens = args.groups * args.prefix_tokens + args.groups * args.per_group * (
        args.own + args.new_tokens
    )
    return Engine(
        "dummy:tiny",
        device="cpu",
        dtype="float32",
        max_running_requests=args.max_running,
        max_num_batched_tokens=args.token_budget,
        kv_cache_tokens=2 * tokens,  # room for the whole workload, as on the GPU: no eviction
        page_size=1,
        policy="lpm",
        overlap_schedule=args.overlap,
        grammar_warmup=False,  # not this benchmark's work (bench.schedule_overhead says why)
    )


def install_runner(engine: Engine, kind: str) -> None:
    worker = engine.worker

    def swap() -> None:
        if kind == "scheduler":
            worker.scheduler.runner = _Parity(worker.req_table.max_requests)
            return
        runner = worker.runner
        runner.model = _NoModel(worker.arch.hidden_size, worker.arch.vocab_size)  # type: ignore[assignment]
        runner.attn = _NoAttention()  # type: ignore[assignment]
        runner.decode_graphs = None
        worker.scheduler.runner = runner

    engine.call(swap)


class _Collections:
    """A gc callback: the collector's wall time and its collections per generation, in
    whichever thread collects."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.by_generation = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._t0
        self.by_generation[info["generation"]] += 1


def one_call(engine: Engine, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """One timed `generate` over the workload (cache flushed first), its results checked:
    its wall seconds, the CPU seconds of the caller's thread (the requests' validation and
    building, submitting, collecting) and of the scheduler thread in it, the garbage
    collector's time and collections in it, its steps, and the prompt tokens the cache
    served."""
    params = {"temperature": 0.0, "max_new_tokens": args.new_tokens, "ignore_eos": True}
    assert engine.flush_cache()
    steps0 = engine.get_stats().num_steps
    sched0 = engine.call(time.thread_time)
    collections = _Collections()
    gc.callbacks.append(collections)
    caller0 = time.thread_time()
    t0 = time.perf_counter()
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
    finally:
        dt = time.perf_counter() - t0
        caller = time.thread_time() - caller0
        gc.callbacks.remove(collections)
    sched = engine.call(time.thread_time) - sched0
    steps = engine.get_stats().num_steps - steps0
    assert isinstance(outs, list) and len(outs) == len(prompts)
    assert all(o["output_ids"] == [TOKEN] * args.new_tokens for o in outs)
    w = engine.worker
    accounted = engine.call(
        lambda: w.allocator.num_free_slots + w.cache.total_size() == w.allocator.num_usable_slots
    )
    assert accounted, "KV slots leaked"
    return {
        "runs_s": dt,
        "caller_cpu_s": caller,
        "scheduler_cpu_s": sched,
        "gc_s": collections.seconds,
        "gc_collections": collections.by_generation,
        "steps": steps,
        "cached_tokens": sum(o["meta_info"]["cached_tokens"] for o in outs),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """This tree's figures: per runner, `repeats` timed calls after a warm-up."""
    out: dict[str, Any] = {}
    for kind in args.runners.split(","):
        engine = make_engine(args)
        try:
            install_runner(engine, kind)
            prompts = shared_prompts(args, engine.worker.arch.vocab_size)
            one_call(engine, prompts, args)  # warm-up
            if args.profile:
                out[kind] = profile_call(engine, prompts, args, kind)
                continue
            calls = [one_call(engine, prompts, args) for _ in range(args.repeats)]
            stats = engine.get_stats()
        finally:
            engine.shutdown()
        out[kind] = {
            **{k: [c[k] for c in calls] for k in SERIES},
            # The process's, over the warm-up and the timed calls.
            "cache_hit_tokens": stats.cache_hit_tokens,
            "prompt_tokens": stats.prompt_tokens,
        }
        del engine
        gc.collect()
    return out


def profile_call(
    engine: Engine, prompts: list[list[int]], args: argparse.Namespace, kind: str
) -> dict[str, Any]:
    """One call with the scheduler thread under cProfile; the top functions by own time."""
    # The thread's CPU time, not wall time: waits for the GIL and the inbox are left out.
    prof = cProfile.Profile(time.thread_time)
    engine.call(prof.enable)  # profiles the thread it is enabled on: the scheduler's
    t = one_call(engine, prompts, args)["runs_s"]
    engine.call(prof.disable)
    path = Path(args.profile) / f"shared_prefix_host-{kind}.prof"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(path)
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:25]  # type: ignore[attr-defined]
    print(f"profile ({kind}, {t:.3f} s under the profiler): {path}")
    st.sort_stats("tottime").print_stats(25)
    return {
        "profiled_s": t,
        "top_tottime": [
            {"function": f"{f[0]}:{f[1]}({f[2]})", "calls": v[1], "tottime_s": v[2]}
            for f, v in rows
        ],
    }


def _argv(args: argparse.Namespace) -> list[str]:
    argv = argv_of(args, (*WORKLOAD_ARGS, "repeats", "runners"))
    return argv + (["--overlap"] if args.overlap else ["--no-overlap"])


SERIES = (
    "runs_s",
    "caller_cpu_s",
    "scheduler_cpu_s",
    "gc_s",
    "gc_collections",
    "steps",
    "cached_tokens",
)


def summarize(series: dict[str, list[Any]], requests: int) -> dict[str, Any]:
    runs = series["runs_s"]
    best, median = min(runs), statistics.median(runs)
    return {
        "best_s": best,
        "median_s": median,
        "req_per_s_best": requests / best,
        "req_per_s_median": requests / median,
        "us_per_request_best": 1e6 * best / requests,
        "caller_cpu_s_median": statistics.median(series["caller_cpu_s"]),
        "scheduler_cpu_s_median": statistics.median(series["scheduler_cpu_s"]),
        "steps_median": statistics.median(series["steps"]),
        "gc_s_median": statistics.median(series["gc_s"]),
        "cached_tokens_min": min(series["cached_tokens"]),
        **series,
    }


def print_table(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    print(
        f"{'tree':<7}{'runner':<11}{'best s':>8}{'median s':>10}{'req/s best':>12}"
        f"{'req/s med':>11}{'us/req':>8}{'caller cpu':>12}{'sched cpu':>11}{'gc':>7}"
        f"{'cached min':>12}"
    )
    for name, by_kind in results.items():
        for kind, f in by_kind.items():
            print(
                f"{name:<7}{kind:<11}{f['best_s']:8.3f}{f['median_s']:10.3f}"
                f"{f['req_per_s_best']:12.1f}{f['req_per_s_median']:11.1f}"
                f"{f['us_per_request_best']:8.0f}{f['caller_cpu_s_median']:12.3f}"
                f"{f['scheduler_cpu_s_median']:11.3f}{f['gc_s_median']:7.3f}"
                f"{f['cached_tokens_min']:12,}"
            )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_workload_arguments(ap)
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument(
        "--runners", default=",".join(RUNNERS), help="comma-separated: inputs, scheduler"
    )
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per runner and process")
    ap.add_argument("--tree", default=None, help="also run against this checkout ('before')")
    ap.add_argument("--rounds", type=int, default=1, help="with --tree: alternations")
    ap.add_argument("--profile", default=None, help="a folder: cProfile one call per runner")
    ap.add_argument("--json-only", default=None, help=argparse.SUPPRESS)
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    if args.json_only or args.profile:
        res = run(args)
        if args.json_only:
            Path(args.json_only).write_text(json.dumps(res))
        return
    requests = args.groups * args.per_group
    trees = {"this": None} if args.tree is None else {"before": args.tree, "after": None}
    raw: dict[str, dict[str, dict[str, list[Any]]]] = {t: {} for t in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            res = run_tree(
                tree if tree is not None else str(BENCH_DIR.parent),
                "bench.shared_prefix_host",
                _argv(args),
            )
            for kind, r in res.items():
                into = raw[name].setdefault(kind, {k: [] for k in SERIES})
                for k in SERIES:
                    into[k].extend(r[k])
    results = {
        name: {kind: summarize(series, requests) for kind, series in by_kind.items()}
        for name, by_kind in raw.items()
    }
    print_table(results)
    figures = {
        "model": "none (dummy:tiny's tokenizer, pool and engine; the model stubbed out)",
        "workload": {
            "requests": requests,
            "groups": args.groups,
            "prefix_tokens": args.prefix_tokens,
            "own": args.own,
            "new_tokens": args.new_tokens,
            "max_running_requests": args.max_running,
            "max_num_batched_tokens": args.token_budget,
            "overlap_schedule": args.overlap,
        },
        "results": results,
    }
    record.write("shared_prefix_host", args, figures)


if __name__ == "__main__":
    main()
