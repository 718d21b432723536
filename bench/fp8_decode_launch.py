"""The CUDA FP8 decode launch a decode sweep found fastest, as RADIXMESH_FP8_DECODE's value.

`python -m bench.fp8_decode_launch bench/results/attention_decode_quick-h200.json` prints
`cuda:W,K,S,B` (kernels/decode_fp8_cuda.py's LAUNCHES): the launch with the least geometric
mean time over the sweep's shapes of batch >= 64, where its time is the kernel's (batch 1
is bound by launch latency), at the backend's split count (the engine's).
bench/engine_gpu.sh's fp8cudae2e part runs the engine with it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any


def best_launch(rows: list[dict[str, Any]]) -> tuple[int, int, int, int]:
    times: dict[tuple[int, int, int, int], list[float]] = {}
    for r in rows:
        at_backend_splits = r.get("splits") == r.get("backend_splits", r.get("splits"))
        if r.get("cuda") and "ms" in r and r["batch"] >= 64 and at_backend_splits:
            key = (r["num_warps"], r["block_n"], r["num_stages"], r["min_blocks"])
            times.setdefault(key, []).append(r["ms"])
    if not times:
        raise SystemExit("no CUDA launch timed at batch >= 64 in the sweep")
    shapes = max(len(v) for v in times.values())
    complete = {k: v for k, v in times.items() if len(v) == shapes}
    return min(complete, key=lambda k: math.fsum(math.log(t) for t in complete[k]))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    rows = json.loads(Path(args[0]).read_text())["decode_sweep"]
    print("cuda:" + ",".join(str(x) for x in best_launch(rows)))


if __name__ == "__main__":
    main()
