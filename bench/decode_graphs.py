"""Decode CUDA graphs on the GPU: greedy tokens and throughput with graphs on vs off.

`python -m bench.decode_graphs` on a CUDA machine, dummy:llama-3-8b in bf16: 16 prompts x
32 greedy tokens (decode batch 16, a ladder size: no padding) must give the same tokens,
then 256 x (512 in, 64 out) output tokens per second with each setting.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import torch

from bench import record
from radixmesh.worker.engine import Engine


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    rng = random.Random(0)
    small = [[rng.randrange(256, 128000) for _ in range(rng.randrange(8, 600))] for _ in range(16)]
    big = [[rng.randrange(256, 128000) for _ in range(512)] for _ in range(256)]
    greedy = {"temperature": 0.0, "max_new_tokens": 32, "ignore_eos": True}
    report: dict[str, Any] = {}
    tokens = {}
    for graphs in (256, 0):
        t0 = time.perf_counter()
        eng = Engine(
            "dummy:llama-3-8b", device="cuda", kv_cache_bytes=40 << 30,
            max_running_requests=256, max_num_batched_tokens=8192,
            cuda_graph_max_batch_size=graphs,
        )  # fmt: skip
        init = time.perf_counter() - t0
        res = eng.generate(input_ids=small, sampling_params=greedy)
        assert isinstance(res, list)
        tokens[graphs] = [r["output_ids"] for r in res]
        eng.flush_cache()
        t0 = time.perf_counter()
        outs = eng.generate(
            input_ids=big,
            sampling_params={"temperature": 0.0, "max_new_tokens": 64, "ignore_eos": True},
        )
        dt = time.perf_counter() - t0
        assert isinstance(outs, list)
        n = sum(len(o["output_ids"]) for o in outs)
        g = eng.worker.runner.decode_graphs
        report[f"graphs_{graphs}"] = {
            "init_seconds": init,
            "seconds": dt,
            "output_tok_per_s": n / dt,
            "replays": g.num_replays if g else 0,
        }
        eng.shutdown()
        del eng
        torch.cuda.empty_cache()
    report["identical_greedy"] = sum(a == b for a, b in zip(tokens[256], tokens[0], strict=True))
    print(json.dumps(report, indent=1))
    record.write("decode_graphs", args, report)


if __name__ == "__main__":
    main()
