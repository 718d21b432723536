"""FP8 linear layers at decode shapes: bf16 against the two FP8 paths, side by side.

For each of Llama-3-8B's four GEMMs (fused qkv 6144 x 4096, o 4096 x 4096, fused gate/up
28672 x 4096, down 4096 x 14336) and each row count (a decode batch), the time of:
  bf16        F.linear on bfloat16 weights (the baseline)
  scaled_mm   per-token activation quantization + torch._scaled_mm (the FP8 GEMM path)
  small_m     the weight-only small-batch kernel (layers/kernels/fp8_small_m.py), rows
              <= its MAX_ROWS only
each timed with CUDA graphs of 20 calls (no launch gaps), median of 9, and the weight
bytes each reads per microsecond against the device's copy rate. Also the largest
relative error of each FP8 path against float32 on the dequantized weights.
Run (CUDA, sm90+): `python -m bench.fp8_gemm [--rows 1,4,8,16,64,256]`.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench import record
from bench.attention_kernels import rel_err

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def time_us(fn: Callable[[], torch.Tensor], calls: int = 20, repeats: int = 9) -> float:
    fn()  # compile / warm up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def one_shape(name: str, n: int, k: int, rows: int) -> dict[str, Any]:
    from radixmesh.worker.layers.kernels.fp8_small_m import MAX_ROWS, fp8_small_m_linear
    from radixmesh.worker.layers.quantization.fp8 import fp8_linear_scaled_mm, quantize_rows

    gen = torch.Generator(device="cuda").manual_seed(n + k + rows)
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.02
    x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    q, scale = quantize_rows(w)
    w16 = w.to(torch.bfloat16)
    ref = F.linear(x.float(), q.float() * scale[:, None])
    res: dict[str, Any] = {"shape": name, "n": n, "k": k, "rows": rows}
    res["bf16_us"] = time_us(lambda: F.linear(x, w16))
    res["scaled_mm_us"] = time_us(lambda: fp8_linear_scaled_mm(x, q, scale, None))
    res["scaled_mm_rel_err"] = rel_err(fp8_linear_scaled_mm(x, q, scale, None), ref)
    if rows <= MAX_ROWS:
        res["small_m_us"] = time_us(lambda: fp8_small_m_linear(x, q, scale, None))
        res["small_m_rel_err"] = rel_err(fp8_small_m_linear(x, q, scale, None), ref)
    for path, nbytes in (("bf16", 2), ("scaled_mm", 1), ("small_m", 1)):
        if f"{path}_us" in res:
            res[f"{path}_weight_GBps"] = n * k * nbytes / res[f"{path}_us"] / 1e3
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", default="1,4,8,16,64,256", help="comma-separated row counts")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    results = [one_shape(s, n, k, r) for r in rows for s, (n, k) in SHAPES.items()]
    print(f"{'shape':8} {'rows':>4} {'bf16 us':>9} {'scaled_mm':>9} {'small_m':>9} {'fp8/bf16':>8}")
    for r in results:
        best = min(r["scaled_mm_us"], r.get("small_m_us", float("inf")))
        small = f"{r['small_m_us']:9.1f}" if "small_m_us" in r else f"{'-':>9}"
        print(
            f"{r['shape']:8} {r['rows']:>4} {r['bf16_us']:9.1f} {r['scaled_mm_us']:9.1f} "
            f"{small} {best / r['bf16_us']:8.2f}"
        )
    record.write("fp8_gemm", args, {"results": results})


if __name__ == "__main__":
    main()
