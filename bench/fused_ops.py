"""The decoder layer's fused elementwise kernels against FlashInfer's, on the GPU, same inputs.

Ours (radixmesh/worker/layers/kernels/, Triton): add + RMSNorm (the residual updated in
place, the normalized rows out) and SiLU-and-mul; FlashInfer's `fused_add_rmsnorm` (both in
place) and `silu_and_mul`. Llama-3-8B widths (hidden 4,096, intermediate 14,336), bf16, at
the rows of a decode step (1, 256) and of a prefill chunk (8,192). Each pair is first
checked against the other (max abs difference), then timed with do_bench (median, us).

Run on a CUDA machine with flashinfer installed: `python -m bench.fused_ops [--out FILE]`;
prints a table and writes its record to bench/results/fused_ops-<machine>.json.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from triton.testing import do_bench

from bench import record
from radixmesh.worker.layers.kernels.rms_norm import fused_add_rms_norm
from radixmesh.worker.layers.kernels.silu_mul import silu_and_mul

HIDDEN, INTER, EPS = 4096, 14336, 1e-5
ROWS = (1, 256, 8192)


def norm_row(flashinfer: Any, m: int) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(m)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).bfloat16()

    x, res, w = rand(m, HIDDEN), rand(m, HIDDEN), rand(HIDDEN)
    r1, r2 = res.clone(), res.clone()
    ours = fused_add_rms_norm(x, r1, w, EPS)
    theirs = x.clone()
    flashinfer.fused_add_rmsnorm(theirs, r2, w, EPS)
    diff = max((ours - theirs).abs().max().item(), (r1 - r2).abs().max().item())
    a = do_bench(lambda: fused_add_rms_norm(x, r1, w, EPS), warmup=10, rep=50)
    x2 = x.clone()
    b = do_bench(lambda: flashinfer.fused_add_rmsnorm(x2, r2, w, EPS), warmup=10, rep=50)
    return {"op": "add+rmsnorm", "rows": m, "ours_us": a * 1e3, "flashinfer_us": b * 1e3,
            "max_abs_diff": diff}  # fmt: skip


def act_row(flashinfer: Any, m: int) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn((m, 2 * INTER), generator=g, device="cuda").bfloat16()
    diff = (silu_and_mul(x) - flashinfer.activation.silu_and_mul(x)).abs().max().item()
    a = do_bench(lambda: silu_and_mul(x), warmup=10, rep=50)
    b = do_bench(lambda: flashinfer.activation.silu_and_mul(x), warmup=10, rep=50)
    return {"op": "silu_and_mul", "rows": m, "ours_us": a * 1e3, "flashinfer_us": b * 1e3,
            "max_abs_diff": diff}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    import flashinfer

    rows = [f(flashinfer, m) for f in (norm_row, act_row) for m in ROWS]
    print("op | rows | ours us | flashinfer us | flashinfer / ours | max abs diff")
    for r in rows:
        r["flashinfer_over_ours"] = r["flashinfer_us"] / r["ours_us"]
        print(f"{r['op']} | {r['rows']} | {r['ours_us']:.1f} | {r['flashinfer_us']:.1f} | "
              f"{r['flashinfer_over_ours']:.2f} | {r['max_abs_diff']:.3g}")  # fmt: skip
    report = {"flashinfer_version": flashinfer.__version__, "rows": rows}
    print(f"wrote {record.write('fused_ops', args, report)}")


if __name__ == "__main__":
    main()
