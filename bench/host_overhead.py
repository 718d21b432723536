"""Host (Python) work per scheduler step at large batch, on `dummy:tiny`.

The model's own time is negligible with `dummy:tiny`, so what a step costs here is the
scheduler's host work: on the GPU that work is serial with the device and bounds a
batch-256 decode step (docs/performance.md). Each part of `Scheduler.step` is timed:

  schedule        Scheduler.schedule (allocation, req->token table, admission)
  build           ModelRunner._forward_batch (ForwardBatch from the batch)
  model           attention prepare + model forward + logits
  sampling        the rest of ModelRunner.forward around the sampler (rows, SamplingRows)
  sampler         Sampler.draw (for greedy rows: one argmax over [B, V])
  process_output  Scheduler.process_output (reading the tokens back, stop checks,
                  detokenizing, emit)

Workload: 256 requests x 64 random prompt tokens, 64 new tokens each, greedy,
ignore_eos, float32, with an incremental detokenizer per request as the engine sets up.
Prints a table (decode steps at full batch, and all steps) and writes JSON to
bench/results/. The machine may be shared: the run is repeated and each figure is the
best of the repeats (noise only ever adds time).
Run: `.venv/bin/python -m bench.host_overhead [--clock thread] [--name NAME]`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench import record
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.batch import Batch
from radixmesh.worker.config import EngineConfig
from radixmesh.worker.detokenizer import IncrementalDetokenizer
from radixmesh.worker.request import Request, RequestOutput
from radixmesh.worker.worker import Worker

PARTS = ("schedule", "build", "model", "sampling", "sampler", "process_output")
# Wall time by default. On a shared machine `--clock thread` (the scheduler thread's CPU
# time) is steadier for the host parts; it leaves out torch's intra-op threads.
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
clock = time.perf_counter


class Timer:
    """Accumulates seconds per part for the current step."""

    def __init__(self) -> None:
        self.step: dict[str, float] = dict.fromkeys(PARTS, 0.0)

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.step[part] += clock() - t0

        return timed


class TimedModel:
    """Stands in for the runner's model so its forward and logits count as `model`."""

    def __init__(self, model: Any, timer: Timer) -> None:
        self._call = timer.wrap("model", model)
        self.compute_logits = timer.wrap("model", model.compute_logits)

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)


def make_worker(args: argparse.Namespace) -> Worker:
    config = EngineConfig.from_options(
        model="dummy:tiny",
        dtype="float32",
        device="cpu",
        max_running_requests=args.requests,
        kv_cache_tokens=args.requests * (args.prompt_len + args.new_tokens) + 1024,
        page_size=args.page_size,
    )
    return Worker(config)


def make_requests(worker: Worker, args: argparse.Namespace) -> list[Request]:
    rng = random.Random(0)
    vocab = worker.arch.vocab_size
    params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True)
    reqs = []
    for i in range(args.requests):
        ids = [rng.randrange(1, vocab) for _ in range(args.prompt_len)]
        req = Request(rid=f"r{i}", prompt_ids=ids, params=params, stop_ids=worker.stop_ids(params))
        req.detokenizer = IncrementalDetokenizer(worker.tokenizer, ids)
        outputs: list[RequestOutput] = []
        req.sink = outputs.append
        reqs.append(req)
    return reqs


def run(args: argparse.Namespace) -> dict[str, Any]:
    worker = make_worker(args)
    sched, runner = worker.scheduler, worker.runner
    timer = Timer()
    sched.schedule = timer.wrap("schedule", sched.schedule)  # type: ignore[method-assign]
    sched.process_output = timer.wrap("process_output", sched.process_output)  # type: ignore[method-assign]
    runner._forward_batch = timer.wrap("build", runner._forward_batch)  # type: ignore[method-assign]
    runner.attn.prepare = timer.wrap("model", runner.attn.prepare)  # type: ignore[method-assign]
    runner.model = TimedModel(runner.model, timer)  # type: ignore[assignment]
    runner.sampler.draw = timer.wrap("sampler", runner.sampler.draw)  # type: ignore[method-assign]
    forward = runner.forward
    batches: list[Batch] = []

    def timed_forward(batch: Batch) -> Any:
        batches.append(batch)
        t0 = clock()
        out = forward(batch)
        timer.step["forward"] = clock() - t0
        return out

    runner.forward = timed_forward  # type: ignore[method-assign]
    reqs = make_requests(worker, args)
    for req in reqs:
        sched.add_request(req)
    steps: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    while sched.has_work():
        timer.step = dict.fromkeys(PARTS, 0.0)
        n_before = len(batches)
        t0 = clock()
        sched.step()
        total = clock() - t0
        if len(batches) == n_before:
            continue
        batch = batches[-1]
        step = dict(timer.step)
        fwd = step.pop("forward", 0.0)
        step["sampling"] = fwd - step["build"] - step["model"] - step["sampler"]
        step["total"] = total
        step["batch_size"] = len(batch.items)
        step["decode"] = all(it.num_new_tokens == 1 for it in batch.items)
        steps.append(step)
    wall = time.perf_counter() - t_all
    assert all(r.num_output_tokens == args.new_tokens for r in reqs)
    return summarize(steps, wall, args)


def summarize(steps: list[dict[str, Any]], wall: float, args: argparse.Namespace) -> dict[str, Any]:
    full = [s for s in steps if s["decode"] and s["batch_size"] == args.requests]
    # Skip the first full decode steps: allocator/torch warm-up.
    full = full[2:] if len(full) > 4 else full

    def per_part(group: list[dict[str, Any]]) -> dict[str, float]:
        return {k: statistics.median(s[k] for s in group) * 1e3 for k in (*PARTS, "total")}

    return {
        "decode_full_batch_ms_median": per_part(full),
        "decode_full_batch_steps": len(full),
        "all_steps_ms_mean": {
            k: sum(s[k] for s in steps) / len(steps) * 1e3 for k in (*PARTS, "total")
        },
        "num_steps": len(steps),
        "wall_seconds": wall,
        "output_tokens": args.requests * args.new_tokens,
    }


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each per-part figure as the minimum over the repeats."""
    best = dict(runs[0])
    for key in ("decode_full_batch_ms_median", "all_steps_ms_mean"):
        best[key] = {k: min(r[key][k] for r in runs) for k in runs[0][key]}
    best["wall_seconds"] = min(r["wall_seconds"] for r in runs)
    best["repeats"] = len(runs)
    return best


def print_table(res: dict[str, Any]) -> None:
    full, mean = res["decode_full_batch_ms_median"], res["all_steps_ms_mean"]
    print(f"{'part':<16}{'decode@full (median ms)':>26}{'all steps (mean ms)':>22}")
    for k in (*PARTS, "total"):
        print(f"{k:<16}{full[k]:>26.2f}{mean[k]:>22.2f}")
    print(
        f"{res['num_steps']} steps, {res['decode_full_batch_steps']} full decode steps timed, "
        f"{res['wall_seconds']:.2f} s wall"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    res = best_of([run(args) for _ in range(args.repeats)])
    print_table(res)
    figures = {"model": "dummy:tiny", "dtype": "float32", "results": res}
    clock_name = None if args.clock == "wall" else args.clock
    record.write("host_overhead", args, figures, name=clock_name)


if __name__ == "__main__":
    main()
