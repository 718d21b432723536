"""Is cuBLAS batch-invariant? Every row count of Llama-3-8B's GEMMs, with and without a
workspace, and what going without one costs.

Deterministic mode keeps cuBLAS for a weight shape when, with zero workspace
(`CUBLAS_WORKSPACE_CONFIG=:0:0`), every row of F.linear has the same bits at every row
count checked (layers/cublas_check.py). This measures that claim exhaustively: for each
shape, each workspace setting (a child process each: PyTorch reads the setting once) and
every M from 1 to `--max-rows` (the LM head to `--head-rows`, the most rows it takes in a
step), the row counts whose rows differ from the same rows of a `--max-rows` batch; and
microseconds per call at a few row counts (CUDA graphs, median), zero workspace against
the default, with the batch-invariant Triton matmul beside them.
Run (CUDA): `python -m bench.cublas_invariance`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from typing import Any

from bench import record

SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}
SETTINGS = {"default": None, "zero": ":0:0"}
TIMED_ROWS = (1, 16, 64, 256, 8192)


def _cublas(x: Any, w: Any, _i: int) -> Any:
    import torch.nn.functional as F

    return F.linear(x, w)


def _triton(x: Any, w: Any, _i: int) -> Any:
    from radixmesh.worker.layers.kernels import batch_invariant_matmul as bim

    return bim.linear(x, w, None)


def child(max_rows: int, head_rows: int) -> dict[str, Any]:
    """In a process with this setting: per shape, the row counts that differ, and times."""
    import torch

    from radixmesh.worker.layers.cublas_check import rows_invariant
    from radixmesh.worker.layers.kernels.timing import time_us

    out: dict[str, Any] = {}
    for name, (n, k) in SHAPES.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        w = (torch.randn(n, k, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
        top = head_rows if name == "lm_head" else max_rows
        bad = rows_invariant(w, None, range(1, top + 1))
        times: dict[str, float] = {}
        for m in TIMED_ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            times[f"cublas_{m}"] = time_us(functools.partial(_cublas, x, w))
            times[f"triton_{m}"] = time_us(functools.partial(_triton, x, w))
        out[name] = {"n": n, "k": k, "checked_to": top, "differs_at": bad, "us": times}
        print(name, "differs at", bad[:20], f"({len(bad)})", times, flush=True)
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-rows", type=int, default=8192)
    ap.add_argument("--head-rows", type=int, default=512)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    if args.child:
        with open(args.child, "w") as f:
            json.dump(child(args.max_rows, args.head_rows), f)
        return
    figures: dict[str, Any] = {}
    for label, value in SETTINGS.items():
        env = dict(os.environ)
        env.pop("CUBLAS_WORKSPACE_CONFIG", None)
        if value is not None:
            env["CUBLAS_WORKSPACE_CONFIG"] = value
        path = f"/tmp/cublas_invariance_{label}.json"
        cmd = [sys.executable, "-m", "bench.cublas_invariance", "--child", path,
               "--max-rows", str(args.max_rows), "--head-rows", str(args.head_rows)]  # fmt: skip
        subprocess.run(cmd, env=env, check=True)
        with open(path) as f:
            figures[label] = json.load(f)
    print(f"{'shape':<9}{'differs (default)':>19}{'differs (zero)':>16}"
          + "".join(f"{f'zero/default {m}':>18}" for m in TIMED_ROWS)
          + "".join(f"{f'triton/zero {m}':>17}" for m in TIMED_ROWS))  # fmt: skip
    for name in SHAPES:
        d, z = figures["default"][name], figures["zero"][name]
        ratios = "".join(
            f"{z['us'][f'cublas_{m}'] / d['us'][f'cublas_{m}']:>18.2f}" for m in TIMED_ROWS
        )
        vs_triton = "".join(
            f"{z['us'][f'triton_{m}'] / z['us'][f'cublas_{m}']:>17.2f}" for m in TIMED_ROWS
        )
        print(f"{name:<9}{len(d['differs_at']):>19}{len(z['differs_at']):>16}{ratios}{vs_triton}")
    print(f"wrote {record.write('cublas_invariance', args, figures)}")


if __name__ == "__main__":
    main()
