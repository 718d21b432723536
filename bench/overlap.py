"""Overlap scheduling on vs off on `dummy:tiny`: decode steps per second and output tok/s.

The workload of bench/host_overhead.py (N requests x 64 random prompt tokens, 64 new
tokens, greedy, ignore_eos, an incremental detokenizer per request), run through
`Scheduler.step` with `overlap_schedule` off and on, alternating, best of `--repeats`.
On the CPU the "device" is synchronous: launch runs the forward before returning, so
nothing overlaps and the figure is the overlap machinery's own cost (relative only; the
machine is shared: the comparison uses the process's CPU time, steadier than wall time
when other processes take the cores; torch runs one thread). The gain is on CUDA, where
the forward runs asynchronously: there run bench/offline.py or bench/tp.py with
--overlap-schedule.
Run: `.venv/bin/python -m bench.overlap [--requests 256]`.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import torch

from bench import record
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.config import EngineConfig
from radixmesh.worker.detokenizer import IncrementalDetokenizer
from radixmesh.worker.request import Request, RequestOutput
from radixmesh.worker.worker import Worker


def run_once(args: argparse.Namespace, overlap: bool) -> dict[str, Any]:
    worker = Worker(
        EngineConfig.from_options(
            model="dummy:tiny",
            dtype="float32",
            device="cpu",
            max_running_requests=args.requests,
            kv_cache_tokens=args.requests * (args.prompt_len + args.new_tokens + 1) + 1024,
            overlap_schedule=overlap,
        )
    )
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True)
    reqs = []
    for i in range(args.requests):
        ids = [rng.randrange(1, worker.arch.vocab_size) for _ in range(args.prompt_len)]
        req = Request(rid=f"r{i}", prompt_ids=ids, params=params, stop_ids=worker.stop_ids(params))
        req.detokenizer = IncrementalDetokenizer(worker.tokenizer, ids)
        outputs: list[RequestOutput] = []
        req.sink = outputs.append
        reqs.append(req)
    sched = worker.scheduler
    for req in reqs:
        sched.add_request(req)
    steps = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while sched.has_work():
        sched.step()
        steps += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert all(r.num_output_tokens == args.new_tokens for r in reqs)
    tokens = [r.output_ids for r in reqs]
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "steps": steps,
        "steps_per_s": steps / cpu,
        "tokens": tokens,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(args.repeats):
        for mode in ("off", "on"):
            runs[mode].append(run_once(args, mode == "on"))
    assert runs["on"][0]["tokens"] == runs["off"][0]["tokens"], "overlap changed the tokens"
    out_tokens = args.requests * args.new_tokens
    result: dict[str, Any] = {}
    for mode, rs in runs.items():
        best = min(rs, key=lambda r: r["cpu_s"])
        result[mode] = {
            "best_cpu_s": best["cpu_s"],
            "steps": best["steps"],
            "steps_per_cpu_s": best["steps_per_s"],
            "output_tok_per_cpu_s": out_tokens / best["cpu_s"],
            "all_cpu_s": [r["cpu_s"] for r in rs],
            "all_wall_s": [r["wall_s"] for r in rs],
        }
        print(
            f"overlap {mode:3}: {best['steps']} steps in {best['cpu_s']:.2f} CPU s "
            f"(best of {len(rs)}): {best['steps_per_s']:.1f} steps/s, "
            f"{out_tokens / best['cpu_s']:.0f} output tok/s"
        )
    result["on_vs_off_cpu"] = result["on"]["best_cpu_s"] / result["off"]["best_cpu_s"]
    print(f"on/off CPU time: {result['on_vs_off_cpu']:.3f}; identical tokens: yes")
    record.write("overlap", args, result)


if __name__ == "__main__":
    main()
