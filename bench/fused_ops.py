"""The decoder layer's fused elementwise kernels against FlashInfer's, on the GPU, same inputs.

Ours (radixmesh/worker/layers/kernels/, Triton): add + RMSNorm (the residual updated in
place, the normalized rows out) and SiLU-and-mul; FlashInfer's `fused_add_rmsnorm` (both in
place) and `silu_and_mul`. Llama-3-8B widths (hidden 4,096, intermediate 14,336), bf16, at
the rows of a decode step (1, 256) and of a prefill chunk (8,192). Each pair is first
checked against the other (max abs difference), then timed with do_bench (median, us).

Run on a CUDA machine with flashinfer installed: `python -m bench.fused_ops [--out FILE]`;
prints a table and writes its record to bench/results/fused_ops-<machine>.json.

`--fp8-quant` times instead (no flashinfer needed) the per-token FP8 quantization fused
into the kernel that produces an FP8 GEMM's input, against the same kernel's 16-bit
output followed by the standalone quantization kernel (`fp8_quant.py`): add + RMSNorm
and SiLU-and-mul at widths 4,096 and 14,336 (Llama-3-8B's hidden and intermediate
sizes), at 256 and 8,192 rows. Each pair is first checked to give the same e4m3 bits
and scales; SiLU-and-mul's fused kernel is also timed at a few launches (column block x
warps; the first is the default). Writes bench/results/fused_ops-fp8quant-<machine>.json.
Run: `python -m bench.fused_ops --fp8-quant`.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

import torch
from triton.testing import do_bench

from bench import record
from radixmesh.worker.layers.kernels.rms_norm import fused_add_rms_norm
from radixmesh.worker.layers.kernels.silu_mul import silu_and_mul

HIDDEN, INTER, EPS = 4096, 14336, 1e-5
ROWS = (1, 256, 8192)
FP8_ROWS, FP8_WIDTHS = (256, 8192), (HIDDEN, INTER)
# SiLU-and-mul's quantizing launches timed: (column block, warps); the first is the default.
FP8_SILU_LAUNCHES = ((1024, 4), (2048, 8), (4096, 8), (1024, 8))


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


def _us(fn: Callable[[], object]) -> float:
    return float(do_bench(fn, warmup=10, rep=50, return_mode="median")) * 1e3


def _same_fp8(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return torch.equal(a[1], b[1]) and torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))


def fp8_norm_row(m: int, width: int) -> dict[str, Any]:
    """add + RMSNorm, then the quantization kernel, against add + RMSNorm writing FP8."""
    from radixmesh.worker.layers.kernels.fp8_quant import per_token_fp8
    from radixmesh.worker.layers.kernels.rms_norm import fused_add_rms_norm_fp8

    g = torch.Generator(device="cuda").manual_seed(m + width)
    x, res = (torch.randn((m, width), generator=g, device="cuda").bfloat16() for _ in range(2))
    w = torch.randn(width, generator=g, device="cuda").bfloat16()
    r1, r2 = res.clone(), res.clone()
    equal = _same_fp8(
        per_token_fp8(fused_add_rms_norm(x, r1, w, EPS)), fused_add_rms_norm_fp8(x, r2, w, EPS)
    ) and torch.equal(r1, r2)
    separate = _us(lambda: per_token_fp8(fused_add_rms_norm(x, r1, w, EPS)))
    fused = _us(lambda: fused_add_rms_norm_fp8(x, r2, w, EPS))
    return {"op": "add+rmsnorm+fp8", "rows": m, "width": width, "separate_us": separate,
            "fused_us": fused, "bits_equal": equal}  # fmt: skip


def fp8_act_row(m: int, width: int) -> dict[str, Any]:
    """SiLU-and-mul, then the quantization kernel, against SiLU-and-mul writing FP8."""
    from radixmesh.worker.layers.kernels.fp8_quant import per_token_fp8
    from radixmesh.worker.layers.kernels.silu_mul import silu_and_mul_fp8

    g = torch.Generator(device="cuda").manual_seed(m + width)
    x = torch.randn((m, 2 * width), generator=g, device="cuda").bfloat16()
    want = per_token_fp8(silu_and_mul(x))
    launches: dict[str, float] = {}
    equal = True
    for block, warps in FP8_SILU_LAUNCHES:
        run = functools.partial(silu_and_mul_fp8, x, block=block, num_warps=warps)
        equal &= _same_fp8(want, run())
        launches[f"{block}x{warps}"] = _us(run)
    separate = _us(lambda: per_token_fp8(silu_and_mul(x)))
    fused = next(iter(launches.values()))
    return {"op": "silu_and_mul+fp8", "rows": m, "width": width, "separate_us": separate,
            "fused_us": fused, "bits_equal": equal, "fused_launches_us": launches}  # fmt: skip


def fp8_quant_main(args: argparse.Namespace) -> None:
    rows = [f(m, w) for f in (fp8_norm_row, fp8_act_row) for w in FP8_WIDTHS for m in FP8_ROWS]
    print("op | rows | width | separate us | fused us | separate / fused | bits equal")
    for r in rows:
        r["separate_over_fused"] = r["separate_us"] / r["fused_us"]
        times = f"{r['separate_us']:.1f} | {r['fused_us']:.1f} | {r['separate_over_fused']:.2f}"
        print(f"{r['op']} | {r['rows']} | {r['width']} | {times} | {r['bits_equal']}")
        if "fused_launches_us" in r:
            launches = {k: round(v, 1) for k, v in r["fused_launches_us"].items()}
            print(f"  launches (block x warps: us) {launches}")
    record.write("fused_ops", args, {"rows": rows}, name="fp8quant")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    record.add_output_arguments(ap)
    ap.add_argument(
        "--fp8-quant",
        action="store_true",
        help="time the FP8 quantization fused into add+RMSNorm and SiLU-and-mul instead",
    )
    args = ap.parse_args(argv)
    if args.fp8_quant:
        fp8_quant_main(args)
        return
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
