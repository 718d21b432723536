"""KV capacity on one GPU: the auto-sized KV pool of a model, and what it left.

Builds an engine with no pool size given, so the worker profiles its largest step and
gives the pool `mem_fraction` of what the weights, that step's activations and the CUDA
graphs leave (radixmesh/worker/pool_sizing.py). Reports the decision, the graphs' memory
as measured after capture, and the pool's share of what weights and activations leave;
then serves a batch that fills most of the pool, to show the budget holds under load.
Writes JSON to bench/results/ (or --out).

GPU: `python -m bench.kv_capacity --model dummy:llama-3-8b --out $OUT/kv-capacity.json`
The target: >= 850k tokens for dummy:llama-3-8b (128 KiB per token) on one H200.
FP8: `--kv-cache-dtype fp8` (and `--quantization fp8`, whose smaller weights leave more
room): compare pool_tokens with the bf16 run (target >= 1.9x).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

import torch

from bench import record
from radixmesh.worker.engine import Engine

GIB = 1 << 30


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="dummy:llama-3-8b")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-running-requests", type=int, default=256)
    ap.add_argument("--cuda-graph-max-batch-size", type=int, default=256)
    ap.add_argument("--mem-fraction", type=float, default=0.9)
    ap.add_argument("--target-tokens", type=int, default=850_000)
    ap.add_argument("--no-load-test", action="store_true")
    ap.add_argument("--quantization", default=None, choices=["fp8"])
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("kv_capacity.py needs CUDA (on CPU the pool is a fixed 512 MiB by default)")

    free_before, total = torch.cuda.mem_get_info()
    t0 = time.perf_counter()
    engine = Engine(
        args.model,
        device="cuda",
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_running_requests=args.max_running_requests,
        cuda_graph_max_batch_size=args.cuda_graph_max_batch_size,
        mem_fraction=args.mem_fraction,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    try:
        report = measure(engine, args, free_before, total, time.perf_counter() - t0)
    finally:
        engine.shutdown()
    print(json.dumps(report, indent=1))
    fp8 = [
        n for n, on in (("fp8w", args.quantization), ("fp8kv", args.kv_cache_dtype == "fp8")) if on
    ]
    record.write("kv_capacity", args, report, name="-".join(fp8) or None)


def measure(
    engine: Engine, args: argparse.Namespace, free_before: int, total: int, start_s: float
) -> dict[str, Any]:
    w = engine.worker
    s = w.pool_sizing
    assert s is not None, "the pool was not auto-sized"
    weights = sum(p.numel() * p.element_size() for p in w.model.parameters())
    left_by_weights_and_activations = s.free_bytes - s.activation_bytes
    report: dict[str, Any] = {
        "engine_start_seconds": start_s,
        "device_total_bytes": total,
        "free_before_engine_bytes": free_before,
        "weights_bytes": weights,
        "sizing": dataclasses.asdict(s),
        "pool_tokens": s.num_tokens,
        "pool_bytes": w.kv_pool.nbytes,
        "cuda_graph_bytes_reserved": s.graph_bytes,
        "cuda_graph_bytes_measured": w.graph_memory_bytes,
        "pool_share_of_what_weights_and_activations_leave": (
            w.kv_pool.nbytes / left_by_weights_and_activations
        ),
        "target_tokens": args.target_tokens,
        "target_met": s.num_tokens >= args.target_tokens,
        "free_after_engine_bytes": torch.cuda.mem_get_info()[0],
    }
    print(s.describe())
    if not args.no_load_test:
        report["load_test"] = fill(engine, args)
    report["free_after_load_bytes"] = torch.cuda.mem_get_info()[0]
    report["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    return report


def fill(engine: Engine, args: argparse.Namespace) -> dict[str, Any]:
    """max_running_requests long prompts at once: prefill chunks at the full token budget
    and a decode batch at the full running size, with most of the pool held."""
    w = engine.worker
    n = args.max_running_requests
    per_req = min(w.context_len, w.allocator.num_usable_slots // n) - 64  # + 32 new each
    vocab = w.arch.vocab_size
    prompts = [[(7 * i + 13 * j) % (vocab - 300) + 256 for j in range(per_req)] for i in range(n)]
    params = {"temperature": 0.0, "max_new_tokens": 32, "ignore_eos": True}
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    dt = time.perf_counter() - t0
    assert isinstance(outs, list)
    stats = engine.get_stats()
    return {
        "requests": n,
        "prompt_tokens_each": per_req,
        "tokens_held_at_peak_at_least": n * per_req,
        "seconds": dt,
        "all_finished": all(len(o["output_ids"]) == 32 for o in outs),
        "kv_slots_total": stats.kv_slots_total,
        "retractions": stats.num_retractions,
    }


if __name__ == "__main__":
    main()
