"""The shapes of TensorRT-LLM's published throughput table, on this engine, bf16 and FP8.

TensorRT-LLM publishes output tokens per second for Llama-3.1-8B-Instruct-FP8 on one H200
(`trtllm-bench throughput`, all requests queued at once, random token ids, fixed input
and output lengths; TensorRT-LLM's docs/source/performance/perf-overview.md, the v1.0
edition's "Llama 3.1 8B" table). This benchmark runs the same kind of load on the
offline engine: `--requests` random prompts of ISL tokens, each generating exactly OSL
tokens (greedy, ignore_eos), all submitted at once, on `dummy:llama-3-8b` (the same
shapes; random weights, since no checkpoint can be downloaded on the GPU machine) in each
`--configs` precision, and prints each figure beside the published one.

Request counts are smaller than TensorRT-LLM's (30,000 at 128/128; 1,500-3,000 elsewhere)
to fit a GPU session; each count keeps the engine's running batch full for most of the
run (the tail, where the last requests drain, is part of the figure, as in theirs).

`--overlap on,off` runs each configuration with the overlap scheduler on and then off,
each in an engine of its own (keys `<config>/overlap-<on|off>`): the two side by side.

Run on one GPU: `python -m bench.peer_shapes [--configs bf16,fp8-all] [--shapes
128/128,1000/1000] [--max-running-requests N] [--cuda-graph-max-batch-size N]
[--overlap on,off]`; CPU
smoke run: `python -m bench.peer_shapes --smoke`. Writes bench/results/peer_shapes-<machine>.json.
"""

from __future__ import annotations

import argparse
import itertools
import random
from typing import Any

from bench import record
from bench.offline import Workload, run_engine
from radixmesh.worker.engine import Engine

# (input, output) -> TensorRT-LLM's published output tok/s, Llama-3.1-8B FP8, one H200.
PUBLISHED = {
    (128, 128): 27_911,
    (128, 2048): 26_221,
    (500, 2000): 20_770,
    (1000, 1000): 17_744,
    (1000, 2000): 16_828,
    (2048, 2048): 12_194,
}
PUBLISHED_SOURCE = (
    "TensorRT-LLM docs/source/performance/perf-overview.md (v1.0 edition), Llama 3.1 8B, "
    "H200 TP1 (FP8), trtllm-bench throughput"
)
# Requests per shape: enough to keep a 1,024-request batch full past its ramp.
REQUESTS = {
    (128, 128): 4096,
    (128, 2048): 1024,
    (500, 2000): 1024,
    (1000, 1000): 1024,
    (1000, 2000): 1024,
    (2048, 2048): 768,
}
DEFAULT_SHAPES = "128/128,1000/1000,2048/2048,500/2000,1000/2000"
# --configs: name -> (quantization, kv_cache_dtype)
CONFIGS = {"bf16": (None, "auto"), "fp8-all": ("fp8", "fp8"), "fp8-kv": (None, "fp8")}


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        isl, _, osl = item.partition("/")
        if not (isl.isdigit() and osl.isdigit()):
            raise ValueError(f"--shapes: {item!r} is not ISL/OSL")
        shapes.append((int(isl), int(osl)))
    return shapes


def prompts(n: int, isl: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256, vocab) for _ in range(isl)] for _ in range(n)]


def run_shape(engine: Engine, isl: int, osl: int, n: int, vocab: int) -> dict[str, Any]:
    """`bench.offline.run_engine` on n random prompts of isl tokens, osl new tokens each,
    the cache flushed first; every request must have generated all osl."""
    ids = prompts(n, isl, vocab, seed=isl * 7919 + osl)
    engine.flush_cache()
    r = run_engine(engine, Workload(f"{isl}/{osl}", ids, osl))
    assert r["output_tokens"] == n * osl, (r["output_tokens"], n * osl)
    return {"requests": n, **r}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="dummy:llama-3-8b")
    ap.add_argument("--configs", default="bf16,fp8-all")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="ISL/OSL,...")
    ap.add_argument("--requests-scale", type=float, default=1.0, help="times REQUESTS")
    ap.add_argument("--max-running-requests", type=int, default=None, help="default: engine's")
    ap.add_argument("--cuda-graph-max-batch-size", type=int, default=None)
    ap.add_argument(
        "--overlap",
        default="auto",
        help="the overlap scheduler, a list of auto (the device's default), on, off: each "
        "config runs once per value, keyed <config>/overlap-<on|off> unless auto",
    )
    ap.add_argument("--smoke", action="store_true", help="CPU: dummy:tiny, tiny shapes")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    shapes = [(16, 8), (32, 4)] if args.smoke else parse_shapes(args.shapes)
    model = "dummy:tiny" if args.smoke else args.model
    options: dict[str, Any] = {}
    if args.max_running_requests is not None:
        options["max_running_requests"] = args.max_running_requests
    if args.cuda_graph_max_batch_size is not None:
        options["cuda_graph_max_batch_size"] = args.cuda_graph_max_batch_size
    overlaps = args.overlap.split(",")
    if not set(overlaps) <= {"auto", "on", "off"}:
        raise ValueError(f"--overlap: {args.overlap!r} is not a list of auto, on, off")
    results: dict[str, Any] = {}
    for config, overlap in itertools.product(args.configs.split(","), overlaps):
        if config not in CONFIGS:
            raise ValueError(f"--configs: unknown {config!r}; choices: {sorted(CONFIGS)}")
        quantization, kv_dtype = CONFIGS[config]
        scheduling = {} if overlap == "auto" else {"overlap_schedule": overlap == "on"}
        name = config if overlap == "auto" else f"{config}/overlap-{overlap}"
        engine = Engine(
            model, quantization=quantization, kv_cache_dtype=kv_dtype, **options, **scheduling
        )
        try:
            vocab = engine.info.vocab_size
            rows = results[name] = {}
            for isl, osl in shapes:
                n = 4 if args.smoke else max(1, round(REQUESTS[(isl, osl)] * args.requests_scale))
                r = run_shape(engine, isl, osl, n, vocab)
                published = PUBLISHED.get((isl, osl))
                r["published_tok_per_s"] = published
                r["vs_published"] = r["output_tok_per_s"] / published if published else None
                rows[f"{isl}/{osl}"] = r
                vs = f"{r['vs_published']:.2f}x" if published else "-"
                print(
                    f"{name:16} {isl:>5}/{osl:<5} x {n:5}: {r['output_tok_per_s']:9,.0f} tok/s "
                    f"({r['seconds']:.1f} s); TensorRT-LLM FP8 {published or '-'}: {vs}",
                    flush=True,
                )
        finally:
            engine.shutdown()
    record.write(
        "peer_shapes",
        args,
        {"model": model, "published_source": PUBLISHED_SOURCE, "configs": results},
    )


if __name__ == "__main__":
    main()
