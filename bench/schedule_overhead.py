"""Host `schedule` and `process_output` per step with a long waiting queue, on `dummy:tiny`.

The GPU shared-prefix workload (bench/offline.py: 1,024 requests in 16 groups sharing a
1,536-token prefix, 64 own tokens, 8 new; all submitted at once) is host-bound on an H200:
choosing what to run over ~1,024 waiting requests and finishing ~235 requests a step cost
more than the GPU's work (docs/performance.md). This runs the same shape through a real
Worker on `dummy:tiny` (float32, CPU), with the GPU defaults that shape the host work
(max_running_requests 256, max_num_batched_tokens 8192, page_size 1, lpm), and times the
two host parts of every step:

  schedule        Scheduler.schedule (admission: the policy's order, prefix matching,
                  allocation, the req->token table)
  process_output  Scheduler.process_output (tokens back, stop checks, detokenizing,
                  finishing requests: cache inserts and frees, emit)

The model's forward is not what this measures, and on this CPU the torch attention backend
takes minutes over the workload's 1,600-token contexts: by default (`--runner host`) the
scheduler's runner is replaced by one that samples token 7 for every row that samples,
without the model (the cache, allocator, request table, detokenizers and output path are
the Worker's own). `--runner model` runs dummy:tiny's real forward. Times are the
scheduler thread's CPU time (`--clock thread`, steady on a shared machine) unless
`--clock wall`.

Python's cyclic garbage collector runs when allocations pile up, and a full collection
scans every live object (model, tokenizer, 1,024 prompts): 130-230 ms on this CPU, landing
in whichever step allocates then. That pause is not the scheduler's work and moves from
step to step with any change, so by default (`--gc frozen`) the setup's objects are
frozen (`gc.freeze()`) before the timed loop; `--gc on` leaves the collector as it is.
Either way the collector's own time is reported (`gc_ms`, `gc_full_collections`).

Steps are classed as on the GPU (bench/step_anatomy.py): prefill (prompt rows only),
mixed (prompt and decode rows), decode (decode rows only). `dummy:tiny`'s vocabulary is
512 tokens, so prompts are random ids in [3, 512); the tree's shape (16 prefixes, 1,024
distinct tails) is what matters to the host, not the ids.

`--tree DIR` runs the same workload against another checkout's `radixmesh` (e.g.
/work/main for "before") in a subprocess and reports both side by side; only options
both trees know are passed. The machine may be shared: each figure is the best of
`--repeats` runs (noise only ever adds time).
Run: `.venv/bin/python -m bench.schedule_overhead [--tree /path/to/main] [--name NAME]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench import record
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.batch import Batch, ForwardOutput, PendingTokens
from radixmesh.worker.config import EngineConfig
from radixmesh.worker.detokenizer import IncrementalDetokenizer
from radixmesh.worker.request import Request, RequestOutput
from radixmesh.worker.worker import Worker

PARTS = ("schedule", "process_output")
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
KINDS = ("prefill", "mixed", "decode")
BENCH_DIR = Path(__file__).resolve().parent


def make_worker(args: argparse.Namespace) -> Worker:
    tokens = args.groups * args.prefix_tokens + args.groups * args.per_group * (
        args.own + args.new_tokens
    )
    config = EngineConfig.from_options(
        model="dummy:tiny",
        dtype="float32",
        device="cpu",
        max_running_requests=args.max_running,
        max_num_batched_tokens=args.token_budget,
        kv_cache_tokens=2 * tokens,  # room for the whole workload: no eviction noise
        page_size=args.page_size,
        policy=args.policy,
        # Not this benchmark's work, and built on a thread of its own it would share the GIL
        # with the first steps (the worker awaits it only after a model warm-up).
        grammar_warmup=False,
    )
    return Worker(config)


def add_workload_arguments(ap: argparse.ArgumentParser) -> None:
    """The shared-prefix workload's shape and the scheduler's sizes (bench.offline's GPU
    shared_prefix shape and engine_gpu.sh's OFFLINE settings by default)."""
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--per-group", type=int, default=64)
    ap.add_argument("--prefix-tokens", type=int, default=1536)
    ap.add_argument("--own", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--token-budget", type=int, default=8192, help="max_num_batched_tokens")


WORKLOAD_ARGS = (
    "groups", "per_group", "prefix_tokens", "own", "new_tokens", "max_running", "token_budget"
)  # fmt: skip


def shared_prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    """Each group's prefix followed by each request's own tokens, group by group."""
    rng = random.Random(0)
    prompts: list[list[int]] = []
    for _ in range(args.groups):
        prefix = [rng.randrange(3, vocab) for _ in range(args.prefix_tokens)]
        prompts += [
            prefix + [rng.randrange(3, vocab) for _ in range(args.own)]
            for _ in range(args.per_group)
        ]
    return prompts


def make_requests(worker: Worker, args: argparse.Namespace) -> list[Request]:
    params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True)
    reqs = []
    for n, ids in enumerate(shared_prompts(args, worker.arch.vocab_size)):
        g, i = divmod(n, args.per_group)
        req = Request(
            rid=f"g{g}-{i}", prompt_ids=ids, params=params, stop_ids=worker.stop_ids(params)
        )
        req.detokenizer = IncrementalDetokenizer(worker.tokenizer, ids)
        outputs: list[RequestOutput] = []
        req.sink = outputs.append
        reqs.append(req)
    return reqs


class HostOnlyRunner:
    """Samples token 7 for each row that reaches the end of its sequence; no model."""

    def forward(self, batch: Batch) -> ForwardOutput:
        out = ForwardOutput.empty(len(batch.items))
        sample = [i for i, item in enumerate(batch.items) if item.samples]
        ids = torch.full((len(sample),), 7, dtype=torch.int64)
        out.tokens = PendingTokens(sample, ids, ids)
        return out


class GCPauses:
    """A gc callback: the collector's time (this thread's CPU) and its full collections."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
            return
        self.seconds += time.thread_time() - self._t0
        self.full += info["generation"] == 2


def _kind(batch: Batch) -> str:
    decode = sum(1 for it in batch.items if it.req.num_computed_tokens >= it.req.num_prompt_tokens)
    if decode == 0:
        return "prefill"
    return "decode" if decode == len(batch.items) else "mixed"


def run(args: argparse.Namespace) -> dict[str, Any]:
    worker = make_worker(args)
    sched = worker.scheduler
    if args.runner == "host":
        sched.runner = HostOnlyRunner()
    clock = CLOCKS[args.clock]
    step: dict[str, float] = {}

    def timed(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                step[part] = step.get(part, 0.0) + clock() - t0

        return call

    sched.schedule = timed("schedule", sched.schedule)  # type: ignore[method-assign]
    sched.process_output = timed("process_output", sched.process_output)  # type: ignore[method-assign]
    kinds: list[str] = []
    launch = sched.launch

    def classify(batch: Batch) -> Any:
        kinds.append(_kind(batch))  # before launch moves the counters
        return launch(batch)

    sched.launch = classify  # type: ignore[method-assign]
    reqs = make_requests(worker, args)
    for req in reqs:
        sched.add_request(req)
    if args.gc == "frozen":
        gc.collect()
        gc.freeze()
    pauses = GCPauses()
    gc.callbacks.append(pauses)
    steps: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    try:
        while sched.has_work():
            step.clear()
            n = len(kinds)
            sched.step()
            if len(kinds) > n:
                steps.append({**dict.fromkeys(PARTS, 0.0), **step, "kind": kinds[-1]})
    finally:
        gc.callbacks.remove(pauses)
        gc.unfreeze()
    wall = time.perf_counter() - t_all
    assert all(r.num_output_tokens == args.new_tokens for r in reqs)
    stats = sched.stats()
    free = worker.allocator.num_free_slots + worker.cache.total_size()
    usable = worker.allocator.num_usable_slots  # close() releases the allocator
    worker.close()
    return {
        "steps": summarize(steps),
        "num_steps": len(steps),
        "first_step_schedule_ms": steps[0]["schedule"] * 1e3,
        "wall_seconds": wall,
        "gc_ms": pauses.seconds * 1e3,
        "gc_full_collections": pauses.full,
        "prompt_tokens": stats.prompt_tokens,
        "cache_hit_tokens": stats.cache_hit_tokens,
        "kv_slots_accounted": free == usable,
    }


def summarize(steps: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        group = [s for s in steps if s["kind"] == kind]
        if not group:
            continue
        row: dict[str, float] = {"steps": len(group)}
        for part in PARTS:
            values = [s[part] * 1e3 for s in group]
            row[f"{part}_mean"] = statistics.fmean(values)
            row[f"{part}_max"] = max(values)
        out[kind] = row
    return out


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each timing as the minimum over the repeats (the step counts are the same)."""
    best = dict(runs[0])
    best["steps"] = {
        kind: {k: min(r["steps"][kind][k] for r in runs) for k in row}
        for kind, row in runs[0]["steps"].items()
    }
    for key in ("first_step_schedule_ms", "wall_seconds", "gc_ms"):
        best[key] = min(r[key] for r in runs)
    best["repeats"] = len(runs)
    return best


def run_tree(tree: str, module: str, argv: list[str]) -> dict[str, Any]:
    """Benchmark `module` (its --json-only run with `argv`) against `tree`'s radixmesh, in
    a subprocess (a directory of links: this `bench`, that `radixmesh`)."""
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(BENCH_DIR, Path(tmp) / "bench")
        os.symlink(Path(tree).resolve() / "radixmesh", Path(tmp) / "radixmesh")
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", module, "--json-only", str(out), *argv]
        env = {**os.environ, "PYTHONPATH": tmp, "PYTHONSAFEPATH": "1"}
        subprocess.run(cmd, cwd=tmp, env=env, check=True)
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def argv_of(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """The command-line options that give `args`' values of `names` again."""
    return [x for n in names for x in (f"--{n.replace('_', '-')}", str(getattr(args, n)))]


def _argv(args: argparse.Namespace) -> list[str]:
    names = ("page_size", "policy", "repeats", "runner", "clock", "gc")
    return argv_of(args, WORKLOAD_ARGS + names)


def print_table(results: dict[str, dict[str, Any]]) -> None:
    print(f"{'tree':<8}{'kind':<9}{'steps':>6}{'schedule ms':>13}{'(max)':>9}{'process ms':>12}")
    for tree, res in results.items():
        for kind, row in res["steps"].items():
            print(
                f"{tree:<8}{kind:<9}{int(row['steps']):>6}{row['schedule_mean']:>13.2f}"
                f"{row['schedule_max']:>9.2f}{row['process_output_mean']:>12.2f}"
            )
        hit = res["cache_hit_tokens"] / max(1, res["prompt_tokens"])
        print(
            f"{tree:<8}first step schedule {res['first_step_schedule_ms']:.2f} ms, "
            f"{res['num_steps']} steps, {res['wall_seconds']:.2f} s wall, "
            f"gc {res['gc_ms']:.1f} ms ({res['gc_full_collections']} full), "
            f"cache hit {res['cache_hit_tokens']}/{res['prompt_tokens']} ({hit:.1%}), "
            f"slots accounted: {res['kv_slots_accounted']}"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_workload_arguments(ap)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--policy", default="lpm")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runner", choices=("host", "model"), default="host")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="thread")
    ap.add_argument("--gc", choices=("frozen", "on"), default="frozen")
    ap.add_argument("--tree", default=None, help="also run against this checkout ('before')")
    ap.add_argument("--json-only", default=None, help=argparse.SUPPRESS)
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    res = best_of([run(args) for _ in range(args.repeats)])
    if args.json_only:
        Path(args.json_only).write_text(json.dumps(res))
        return
    results = {"this": res}
    if args.tree:
        results = {
            "before": run_tree(args.tree, "bench.schedule_overhead", _argv(args)),
            "after": res,
        }
    print_table(results)
    model = "dummy:tiny" if args.runner == "model" else "none (dummy:tiny's tokenizer and pool)"
    figures = {"model": model, "dtype": "float32", "results": results}
    record.write("schedule_overhead", args, figures)


if __name__ == "__main__":
    main()
