"""FP8 linear layers at decode shapes: bf16 against the FP8 paths, side by side.

For each of Llama-3-8B's four GEMMs (fused qkv 6144 x 4096, o 4096 x 4096, fused gate/up
28672 x 4096, down 4096 x 14336) and each row count (a decode batch), the time of:
  bf16        F.linear on bfloat16 weights (the baseline)
  scaled_mm   per-token activation quantization + torch._scaled_mm with row-wise scales
              (the FP8 GEMM path past 16 rows by default)
  tensorwise_mm  the same quantization + the tensor-wise torch._scaled_mm into float32 and
              the scales' epilogue (layers/kernels/fp8_epilogue.py; the table at load
              chooses between the two per shape and row count)
  small_m     the weight-only small-batch kernel (layers/kernels/fp8_small_m.py), rows
              <= its MAX_ROWS only
  cuda_gemv   the same job in CUDA C++ (layers/kernels/fp8_gemv_cuda.py), per-channel
              scales, rows <= 16, where it builds; also at each block size it compiles
              (`cuda_gemv_us_by_warps`) and with a block per slab of 16 channels rather
              than a persistent grid (`cuda_gemv_per_slab_us`)
each timed with CUDA graphs of 20 calls (no launch gaps), median of 9, and the weight
bytes each reads per microsecond against the device's copy rate. Also the largest
relative error of each FP8 path against float32 on the dequantized weights.
Run (CUDA, sm90+): `python -m bench.fp8_gemm [--rows 1,4,8,16,64,256]`.

small_m runs the engine's default scale layout (fp8.DEFAULT_LAYOUT), small_m_channel the
per-channel one, scaled_mm per-channel scales (its row-wise scaling).

`--sweep` tunes the small-batch kernel instead (bench/fp8_sweep.py: every variant and
launch config on each shape at 1, 4 and 16 rows, weights cold in L2, within
`--budget-s`); it prints lines to paste into `CONFIGS` / `ROW_CONFIGS`
(layers/kernels/fp8_small_m.py) and writes `fp8_gemm-sweep-<machine>.json`.
Run: `python -m bench.fp8_gemm --sweep`.

`--table` measures the engine's kernel table (layers/quantization/fp8_gemm_choice.py, the
function the worker runs at load) on the four shapes with random e4m3 weights, per-channel
and per-1x128-group scales, enough copies of each to outgrow the L2 cache: every kernel's
time at each row bucket (1, 2, 4, 8, 16) and the kernel chosen; it writes
`fp8_gemm-table-<machine>.json`, whose "shippable" object is a table file as the engine
reads it (copy it to radixmesh/worker/layers/quantization/fp8_gemm_tables/<gpu>.json to
ship it). Run: `python -m bench.fp8_gemm --table`.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import time
from typing import Any

import torch
import torch.nn.functional as F

from bench import fp8_sweep, record
from bench.fp8_sweep import SHAPES
from radixmesh.worker.layers.kernels.timing import time_us
from radixmesh.worker.layers.quantization.fp8_gemm_choice import rel_err


def _gemv_call(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, warps: int, _call: int
) -> torch.Tensor:
    """The CUDA small-batch GEMM at `warps` a block (a `time_us` call)."""
    from radixmesh.worker.layers.kernels.fp8_gemv_cuda import fp8_gemv_cuda

    return fp8_gemv_cuda(x, q, scale, None, warps=warps)


def one_shape(name: str, n: int, k: int, rows: int) -> dict[str, Any]:
    from radixmesh.worker.layers.kernels.fp8_small_m import MAX_ROWS, fp8_small_m_linear
    from radixmesh.worker.layers.quantization.fp8 import (
        DEFAULT_LAYOUT,
        fp8_linear_scaled_mm,
        fp8_linear_tensorwise,
        quantize_rows,
    )
    from radixmesh.worker.layers.quantization.fp8_scales import dequantize_rows, quantize

    gen = torch.Generator(device="cuda").manual_seed(n + k + rows)
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.02
    x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    q, scale = quantize_rows(w)
    w16 = w.to(torch.bfloat16)
    ref = F.linear(x.float(), q.float() * scale[:, None])
    res: dict[str, Any] = {"shape": name, "n": n, "k": k, "rows": rows}
    res["bf16_us"] = time_us(lambda _: F.linear(x, w16))
    res["scaled_mm_us"] = time_us(lambda _: fp8_linear_scaled_mm(x, q, scale, None))
    res["scaled_mm_rel_err"] = rel_err(fp8_linear_scaled_mm(x, q, scale, None), ref)
    res["tensorwise_mm_us"] = time_us(lambda _: fp8_linear_tensorwise(x, q, scale, None))
    res["tensorwise_mm_rel_err"] = rel_err(fp8_linear_tensorwise(x, q, scale, None), ref)
    if rows <= MAX_ROWS:
        res["small_m_channel_us"] = time_us(lambda _: fp8_small_m_linear(x, q, scale, None))
        res["small_m_channel_rel_err"] = rel_err(fp8_small_m_linear(x, q, scale, None), ref)
        qg, sg = quantize(w, DEFAULT_LAYOUT)
        ref_g = F.linear(x.float(), dequantize_rows(qg, sg, torch.float32))
        res["small_m_us"] = time_us(lambda _: fp8_small_m_linear(x, qg, sg, None))
        res["small_m_rel_err"] = rel_err(fp8_small_m_linear(x, qg, sg, None), ref_g)
        from radixmesh.worker.layers.kernels import fp8_gemv_cuda

        if fp8_gemv_cuda.shapes_fit(x, q, scale) and fp8_gemv_cuda.library(0) is not None:
            gemv = fp8_gemv_cuda.fp8_gemv_cuda
            res["cuda_gemv_us"] = time_us(lambda _: gemv(x, q, scale, None))
            res["cuda_gemv_rel_err"] = rel_err(gemv(x, q, scale, None), ref)
            # Every block size the kernel compiles, beside the one `warps_for` picks.
            res["cuda_gemv_warps"] = fp8_gemv_cuda.warps_for(n, k)
            res["cuda_gemv_us_by_warps"] = {
                str(wc): time_us(functools.partial(_gemv_call, x, q, scale, wc))
                for wc in fp8_gemv_cuda.WARP_COUNTS
                if wc * fp8_gemv_cuda.CHUNK <= k and wc >= 4
            }
            res["cuda_gemv_per_slab_us"] = time_us(
                lambda _: gemv(x, q, scale, None, persistent=False)
            )
    paths = (
        ("bf16", 2),
        ("scaled_mm", 1),
        ("tensorwise_mm", 1),
        ("small_m", 1),
        ("small_m_channel", 1),
        ("cuda_gemv", 1),
    )
    for path, nbytes in paths:
        if f"{path}_us" in res:
            res[f"{path}_weight_GBps"] = n * k * nbytes / res[f"{path}_us"] / 1e3
    return res


# --table's scale layouts: the engine's key ("channel" / "group") and how it quantizes.
TABLE_LAYOUTS = (("channel", "channel"), ("group", "1x128"))


def table(args: argparse.Namespace) -> None:
    """The engine's FP8 GEMM table for Llama-3-8B's shapes, measured as at load."""
    from radixmesh.worker.layers.quantization import fp8_gemm_choice as fgc
    from radixmesh.worker.layers.quantization import fp8_gemm_table as fgt
    from radixmesh.worker.layers.quantization.fp8_scales import quantize

    started = time.monotonic()
    measurer = fgc.CudaMeasurer(torch.device("cuda"))
    shapes: dict[fgc.Shape, list[fgc.Operand]] = {}
    names = {}
    for (name, (n, k)), (layout, quantized) in itertools.product(SHAPES.items(), TABLE_LAYOUTS):
        copies = min(fgc.MAX_OPERANDS, math.ceil(fp8_sweep.COLD_BYTES / (n * k)))
        gen = torch.Generator(device="cuda").manual_seed(n + k)
        ops: list[fgc.Operand] = []
        for _ in range(copies):
            q, scale = quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.02, quantized)
            ops.append((q, scale, None))
        shape = fgc.Shape(n, k, layout, "bfloat16")
        shapes[shape], names[shape] = ops, name
    print(f"FP8 GEMM table: {len(shapes)} shapes, kernels {sorted(measurer.available())}, "
          f"margin {fgt.MARGIN:.0%}", flush=True)  # fmt: skip
    timings = fgc.measure(shapes, measurer)
    gemms = fgc.GemmTable(timings, measurer.available())
    for shape, line in zip(shapes, gemms.describe(shapes), strict=True):
        print(f"{names[shape]:8} {line}")
    key = measurer.fingerprint()
    rows = [
        {"shape": names[s], "n": s.n, "k": s.k, "layout": s.layout, "rows": r,
         "us": timings[s.at(r)], "kernel": gemms.kernel(s, r)}
        for s in shapes
        for r in s.buckets
    ]  # fmt: skip
    seconds = time.monotonic() - started
    print(f"measured in {seconds:.1f} s")
    payload = {
        "margin": fgt.MARGIN,
        "seconds": seconds,
        "table": rows,
        "shippable": fgc.table_data(key, timings),
    }
    record.write("fp8_gemm", args, payload, name="table")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", default="1,4,8,16,64,256", help="comma-separated row counts")
    ap.add_argument("--sweep", action="store_true", help="tune the small-batch kernel's configs")
    ap.add_argument("--table", action="store_true", help="measure the engine's kernel table")
    fp8_sweep.add_arguments(ap)
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    if args.sweep:
        fp8_sweep.sweep(args)
        return
    if args.table:
        table(args)
        return
    rows = [int(r) for r in args.rows.split(",")]
    results = [one_shape(s, n, k, r) for r in rows for s, (n, k) in SHAPES.items()]
    print(
        f"{'shape':8} {'rows':>4} {'bf16 us':>9} {'scaled_mm':>9} {'tensorwise':>10} "
        f"{'small_m':>9} {'(channel)':>9} {'cuda_gemv':>9} {'fp8/bf16':>8} "
        f"{'small_m TB/s':>12} {'gemv TB/s':>9}"
    )
    for r in results:
        best = min(r["scaled_mm_us"], r["tensorwise_mm_us"], r.get("small_m_us", float("inf")))
        small = f"{r['small_m_us']:9.1f}" if "small_m_us" in r else f"{'-':>9}"
        chan = f"{r['small_m_channel_us']:9.1f}" if "small_m_us" in r else f"{'-':>9}"
        tb = f"{r['small_m_weight_GBps'] / 1e3:12.2f}" if "small_m_us" in r else f"{'-':>12}"
        gemv = f"{r['cuda_gemv_us']:9.1f}" if "cuda_gemv_us" in r else f"{'-':>9}"
        gtb = f"{r['cuda_gemv_weight_GBps'] / 1e3:9.2f}" if "cuda_gemv_us" in r else f"{'-':>9}"
        print(
            f"{r['shape']:8} {r['rows']:>4} {r['bf16_us']:9.1f} {r['scaled_mm_us']:9.1f} "
            f"{r['tensorwise_mm_us']:10.1f} "
            f"{small} {chan} {gemv} {best / r['bf16_us']:8.2f} {tb} {gtb}"
        )
    record.write("fp8_gemm", args, {"results": results})


if __name__ == "__main__":
    main()
