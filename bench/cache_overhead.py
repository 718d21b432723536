"""What the radix cache costs where nothing is shared (the target: <= 0.5%), measured on one
engine with the cache switched on and off between runs.

Two engines (bench/offline.py's cache-on and cache-off runs) differ in more than the
cache: each run's first pass is slower, and the spread between engines is larger than the
target. Here one engine runs the throughput workload (256 x 512 random prompt tokens, 256
new, greedy) after a warm-up, alternating cache on and off in ABBA order (on, off, off,
on, ...) so that drift cancels; the cache is flushed before each run and switched with
`RadixCache.disable` while the engine is idle and the tree empty (every reader of the
switch reads it per call, so this is what `disable_radix_cache=True` runs). Reports every
run's seconds, the medians and the ratio of mean times with a rough 95% interval.

  python -m bench.cache_overhead --pairs 2          # CUDA: dummy:llama-3-8b, pool auto-sized
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from bench import record
from bench.offline import gpu_workloads, run_engine
from radixmesh.worker.engine import Engine


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="dummy:llama-3-8b")
    ap.add_argument("--pairs", type=int, default=2, help="ABBA blocks: 2 runs on + 2 off each")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-running-requests", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--kv-cache-tokens", type=int, default=None, help="default: auto on CUDA")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    opts: dict[str, Any] = dict(
        max_running_requests=args.max_running_requests,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    if args.kv_cache_tokens:
        opts["kv_cache_tokens"] = args.kv_cache_tokens
    engine = Engine(args.model, **opts)
    try:
        w = gpu_workloads(engine.tokenizer, engine.worker.arch.vocab_size)[0]
        w.prompts = w.prompts[: args.requests]
        cache = engine.worker.cache
        assert engine.flush_cache()
        run_engine(engine, w)  # warm-up: the first pass of an engine is the slowest
        times: dict[bool, list[float]] = {True: [], False: []}
        order = [True, False, False, True] * args.pairs
        for on in order:
            assert engine.flush_cache()
            cache.disable = not on
            times[on].append(run_engine(engine, w)["seconds"])
        cache.disable = False
    finally:
        engine.shutdown()
    secs_on, secs_off = times[True], times[False]
    ratio = statistics.fmean(secs_on) / statistics.fmean(secs_off)
    # Rough 95% interval of the mean ratio from the two samples' spreads.
    se = (
        statistics.variance(secs_on) / len(secs_on) + statistics.variance(secs_off) / len(secs_off)
    ) ** 0.5
    half = 2.0 * se / statistics.fmean(secs_off)
    res = {
        "order": ["on" if o else "off" for o in order],
        "seconds_on": secs_on,
        "seconds_off": secs_off,
        "median_on": statistics.median(secs_on),
        "median_off": statistics.median(secs_off),
        "overhead_mean_ratio": ratio,
        "overhead_95_interval": [ratio - half, ratio + half],
    }
    print(json.dumps(res, indent=1))
    record.write("cache_overhead", args, {"result": res})


if __name__ == "__main__":
    main()
