"""Deterministic mode's matmul (layers/kernels/batch_invariant_matmul.py) against cuBLAS at
Llama-3-8B's shapes, and a sweep of its tile configurations.

A configuration may depend on (N, K) only, so one choice must serve a decode step (a few
hundred rows, where too few tiles leave SMs idle: 128 x 128 tiles make 64 programs of
N = 4,096 at 256 rows on 132 SMs) and a prefill step (thousands of rows). For each shape
and candidate: microseconds at each row count (CUDA graphs of 20 calls, median of 7),
cuBLAS's F.linear beside it, and a check that row results are bit-identical between a
1-row, a 256-row and an 8,192-row call, and between the split-K kernel and the inline
one at each of those sizes (the time is `linear`'s own choice of path by M). Split
counts 1, 2, 4 and 8 are swept with every tile shape: at decode sizes a split count
multiplies the programs that few tiles leave. The best per shape minimizes the time summed over
`--rows` weighted by `--weights` (default: decode steps at 256 rows dominate the
throughput workload: 256 steps of decode against ~17 of ~8k-token prefill), printed as
TABLE lines and written (`--table`) as the JSON `RADIXMESH_DETERMINISTIC_MATMUL_TABLE`
reads, so an engine can run on the choice in the same call.
Run (CUDA): `python -m bench.deterministic_matmul [--table PATH]`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F

from bench import record
from radixmesh.worker.layers.kernels.timing import time_us

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
# The tiles worth splitting: a sweep without split-K (H200, 2026-12-02) put 128 x 256
# first on every shape at 8,192 rows and 128 x 128 / 64 x 128 (4 stages) next at 256 rows;
# 128 x 64, 64 x 64 and 64 x 256 lost at both ends.
TILES = [
    # block_m, block_n, block_k, group_m, num_warps, num_stages
    (128, 256, 64, 8, 8, 3),
    (128, 128, 64, 8, 8, 3),
    (64, 128, 64, 8, 4, 4),
]
# Every tile shape with each split count (MatmulConfig's last field, split_k).
CANDIDATES = [(*tile, split) for tile in TILES for split in (1, 2, 4, 8)]


def _timed(fn: Any, *args: Any, **kwargs: Any) -> float:
    """Microseconds a call of fn(*args, **kwargs): CUDA graphs of 20 calls, median of 7."""
    return time_us(lambda _: fn(*args, **kwargs), repeats=7)


def sweep_shape(name: str, n: int, k: int, rows: list[int], weights: list[float]) -> list[dict]:
    """Every candidate on one shape: times per row count, invariance, error, weighted cost."""
    from radixmesh.worker.layers.kernels.batch_invariant_matmul import MatmulConfig, linear

    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(max(rows), k, device="cuda", dtype=torch.bfloat16)
    cublas = {m: _timed(F.linear, x[:m], w) for m in rows}
    base = sum(cublas[m] * wt for m, wt in zip(rows, weights, strict=True))
    print(f"{name} ({n}, {k}): cuBLAS " + " / ".join(f"{cublas[m]:.1f}" for m in rows) + " us")
    out: list[dict[str, Any]] = []
    for cand in CANDIDATES:
        cfg = MatmulConfig(*cand)
        row: dict[str, Any] = {"shape": name, "n": n, "k": k, "config": asdict(cfg)}
        row["cublas_us"] = cublas
        try:
            ys = {m: linear(x[:m], w, cfg=cfg) for m in (1, 256, max(rows))}
            # The split and inline kernels must agree bit for bit (that is what lets
            # `linear` choose between them by M), at a decode and a prefill size.
            paths_agree = all(
                torch.equal(
                    linear(x[:m], w, cfg=cfg, path="split"),
                    linear(x[:m], w, cfg=cfg, path="inline"),
                )
                for m in (1, 256, max(rows))
            )
            row["invariant"] = bool(
                torch.equal(ys[1][0], ys[256][0])
                and torch.equal(ys[256], ys[max(rows)][:256])
                and paths_agree
            )
            ref = F.linear(x[:256].float(), w.float())
            row["rel_err"] = float((ys[256].float() - ref).norm() / ref.norm())
            row["us"] = {m: _timed(linear, x[:m], w, cfg=cfg) for m in rows}
            cost = sum(row["us"][m] * wt for m, wt in zip(rows, weights, strict=True))
            row["vs_cublas"] = cost / base
        except Exception as e:  # a config the GPU cannot run is a result
            row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
        us = row.get("us")
        shown = " / ".join(f"{us[m]:.1f}" for m in rows) if us else row["error"]
        extra = f"x{row['vs_cublas']:.2f} inv={row['invariant']}" if us else ""
        print(f"    {cand}: {shown} {extra}")
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    record.add_output_arguments(ap)
    ap.add_argument("--rows", default="1,64,256,8192")
    ap.add_argument("--weights", default="0,0,256,17", help="steps of each row count")
    ap.add_argument("--table", default=None, help="write the best configs here (JSON)")
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    weights = [float(w) for w in args.weights.split(",")]
    torch.manual_seed(0)
    results: list[dict[str, Any]] = []
    best: dict[str, dict[str, Any]] = {}
    for name, (n, k) in SHAPES.items():
        for row in sweep_shape(name, n, k, rows, weights):
            results.append(row)
            ok = "us" in row and row["invariant"]
            if ok and (name not in best or row["vs_cublas"] < best[name]["vs_cublas"]):
                best[name] = row
    table = [{"n": r["n"], "k": r["k"], **r["config"]} for r in best.values()]
    print("best per shape (weighted time against cuBLAS), for TABLE:")
    for r in best.values():
        fields = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        cost = f"{r['shape']}: {r['vs_cublas']:.2f}x cuBLAS"
        print(f"    ({r['n']}, {r['k']}): MatmulConfig({fields}),  # {cost}")
    if args.table:
        with open(args.table, "w") as f:
            json.dump(table, f)
    figures = {"rows": rows, "weights": weights, "results": results, "table": table}
    print(f"wrote {record.write('deterministic_matmul', args, figures)}")


if __name__ == "__main__":
    main()
