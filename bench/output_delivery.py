"""What handing outputs to the caller costs the offline engine: one output per request
when it ends (`Delivery.LAST`, what `Engine.generate` and `async_generate` ask
for without streaming) against one output per request per step (a stream's delivery, and
what those calls got before), in one process, alternating.

Each per-step output is a `RequestOutput` with its `MetaInfo`, built on the scheduler
thread and put on a queue that the caller's thread drains: at 1,024 running requests
that is 1,024 objects, queue hand-offs and wake-ups a step, the caller's share of them
taken from the same GIL the scheduler thread needs. To show that host cost alone, the
scheduler's runner is replaced by one that samples token 7 for every sampling row without
a model (`bench.schedule_overhead.HostOnlyRunner`); the scheduler, cache, detokenizers,
output path and the engine's queues are the real ones (`dummy:tiny`, CPU).

Prints seconds per generate call (best and median of the repeats for each delivery) and
writes JSON to bench/results/. The machine may be shared: the deliveries alternate, and
the best figure is the one to compare (noise only ever adds time).
Run: `.venv/bin/python -m bench.output_delivery [--requests 1024] [--new-tokens 128]`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from bench import record
from bench.schedule_overhead import HostOnlyRunner
from radixmesh.worker.engine import Engine
from radixmesh.worker.request import Request
from radixmesh.worker.request_output import Delivery

DELIVERIES = ("whole", "steps")


def run(args: argparse.Namespace) -> dict[str, Any]:
    engine = Engine(
        "dummy:tiny",
        device="cpu",
        dtype="float32",
        max_running_requests=args.running,
        max_num_batched_tokens=16384,
        grammar_warmup=False,
    )
    engine.call(lambda: setattr(engine.worker.scheduler, "runner", HostOnlyRunner()))
    rng = random.Random(0)
    vocab = engine.worker.arch.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt)] for _ in range(args.requests)]
    params = {"max_new_tokens": args.new_tokens, "ignore_eos": True, "temperature": 0.0}
    submit = engine._enqueue_all
    times: dict[str, list[float]] = {d: [] for d in DELIVERIES}

    def per_step(reqs: list[Request]) -> Any:
        for req in reqs:
            req.delivery = Delivery.STEPS  # each step's delta, as a stream gets
        return submit(reqs)

    try:
        engine.generate(input_ids=prompts[:8], sampling_params=params)  # warm-up
        for i in range(2 * args.repeats):
            delivery = DELIVERIES[i % 2]
            engine._enqueue_all = per_step if delivery == "steps" else submit  # type: ignore[method-assign]
            t0 = time.perf_counter()
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            times[delivery].append(time.perf_counter() - t0)
            assert isinstance(outs, list)
            assert all(len(o["output_ids"]) == args.new_tokens for o in outs)
            engine.flush_cache()
    finally:
        engine._enqueue_all = submit  # type: ignore[method-assign]
        engine.shutdown()
    tokens = args.requests * args.new_tokens
    figures = {
        d: {
            "best_s": min(ts),
            "median_s": statistics.median(ts),
            "us_per_token_best": 1e6 * min(ts) / tokens,
            "runs_s": ts,
        }
        for d, ts in times.items()
    }
    return {
        "workload": {
            "requests": args.requests,
            "prompt_tokens": args.prompt,
            "new_tokens": args.new_tokens,
            "max_running_requests": args.running,
        },
        "deliveries": figures,
        "steps_over_whole_best": figures["steps"]["best_s"] / figures["whole"]["best_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--running", type=int, default=1024, help="max_running_requests")
    ap.add_argument("--repeats", type=int, default=6, help="runs of each delivery")
    record.add_output_arguments(ap)
    args = ap.parse_args()
    result = run(args)
    print(f"{'delivery':<8} {'best s':>8} {'median s':>9} {'us/token':>9}")
    for d, f in result["deliveries"].items():
        print(f"{d:<8} {f['best_s']:8.3f} {f['median_s']:9.3f} {f['us_per_token_best']:9.2f}")
    print(f"per-step outputs cost {result['steps_over_whole_best']:.2f}x whole results (best)")
    record.write("output_delivery", args, result)


if __name__ == "__main__":
    main()
