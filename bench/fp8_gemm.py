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

`--sweep` tunes the small-batch kernel instead: every candidate launch configuration
(`candidates`) on each shape at 1, 4 and 16 rows, checked against float32 (a config
whose relative error passes MAX_REL_ERR is reported and never chosen), timed as above
but with the weights cycled through copies that outgrow the L2 cache (a decode step
reads every layer's weights once: none is in L2 when its GEMM runs). It prints the whole
table, then per shape the config with the least total time over the row counts as a line
to paste into `CONFIGS` (layers/kernels/fp8_small_m.py), and writes
`fp8_gemm-sweep-<machine>.json`. The kernels compile first in `--jobs` processes (Triton's
disk cache keeps them for the timing process). Run: `python -m bench.fp8_gemm --sweep`.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import torch
import torch.nn.functional as F

from bench import record
from bench.attention_kernels import rel_err
from radixmesh.worker.layers.kernels.fp8_small_m import LaunchConfig

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
SWEEP_ROWS = (1, 4, 16)
# Weight copies a sweep cycles through outgrow this (the H200's L2 is 50 MB).
COLD_BYTES = 128 << 20
# The H100 / H200's shared memory a block may take (227 KiB).
SHARED_LIMIT = 227 << 10
SMS = 132
# bfloat16 output against float32: a few bf16 ulps of the result's norm at most.
MAX_REL_ERR = 4e-3


def time_us(fn: Callable[[int], Any], calls: int = 20, repeats: int = 9) -> float:
    """Microseconds a call of `fn(i)` (i: the call's index in the graph), CUDA graphs of
    `calls` calls, median of `repeats`."""
    fn(0)  # compile / warm up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
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
    res["bf16_us"] = time_us(lambda _: F.linear(x, w16))
    res["scaled_mm_us"] = time_us(lambda _: fp8_linear_scaled_mm(x, q, scale, None))
    res["scaled_mm_rel_err"] = rel_err(fp8_linear_scaled_mm(x, q, scale, None), ref)
    if rows <= MAX_ROWS:
        res["small_m_us"] = time_us(lambda _: fp8_small_m_linear(x, q, scale, None))
        res["small_m_rel_err"] = rel_err(fp8_small_m_linear(x, q, scale, None), ref)
    for path, nbytes in (("bf16", 2), ("scaled_mm", 1), ("small_m", 1)):
        if f"{path}_us" in res:
            res[f"{path}_weight_GBps"] = n * k * nbytes / res[f"{path}_us"] / 1e3
    return res


def candidates(n: int, k: int, sms: int = SMS) -> list[LaunchConfig]:
    """Launch configs worth timing on (n, k): column blocks 16-64, K tiles 128-512, 3-5
    stages, 8 warps only on tiles of 32 x 256 and up; K split 2-8 ways while the shape
    stays under 8 programs per SM and each slice keeps 2 K tiles; shared memory fits."""
    out = []
    for bn, bk, warps, stages in itertools.product(
        (16, 32, 64), (128, 256, 512), (4, 8), (3, 4, 5)
    ):
        if bn == 16 and (bk == 128 or warps == 8 or stages != 3):  # 2-8 KiB tiles: depth only
            continue
        if warps == 8 and bn * bk < 32 * 256:
            continue
        blocks = math.ceil(n / bn)
        for split in (1, 2, 4, 8):
            cfg = LaunchConfig(bn, bk, split, warps, stages)
            if cfg.shared_bytes() > SHARED_LIMIT:
                continue
            if split > 1 and (blocks * split > 8 * sms or k < split * 2 * bk):
                continue
            out.append(cfg)
    return out


def compile_keys(configs: Sequence[LaunchConfig]) -> list[LaunchConfig]:
    """One config per distinct compiled GEMM kernel: the tiles, warps, stages, and whether
    K is split (the summing kernel's few variants compile at their first use)."""
    seen: dict[tuple[int, int, int, int, bool], LaunchConfig] = {}
    for c in configs:
        seen.setdefault((c.block_n, c.block_k, c.num_warps, c.num_stages, c.split_k > 1), c)
    return list(seen.values())


def _compile(configs: list[LaunchConfig]) -> int:
    """Run each config once at a small shape whose Triton specialization (every size and
    stride a multiple of 16, K a multiple of each K tile) is the Llama shapes': the
    compiled kernels land in Triton's disk cache for the timing process."""
    from radixmesh.worker.layers.kernels.fp8_small_m import fp8_small_m_linear

    x = torch.zeros(1, 1024, device="cuda", dtype=torch.bfloat16)
    q = torch.zeros(64, 1024, device="cuda").to(torch.float8_e4m3fn)
    scale = torch.ones(64, device="cuda")
    done = 0
    for cfg in configs:
        try:
            fp8_small_m_linear(x, q, scale, None, cfg)
            done += 1
        except Exception:  # the timing process reports it, with its error
            pass
    torch.cuda.synchronize()
    return done


def precompile(configs: Sequence[LaunchConfig], jobs: int) -> None:
    keys = compile_keys(configs)
    if jobs <= 1:
        return  # each compiles at its first timed call
    chunks = [keys[i::jobs] for i in range(jobs)]
    try:
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            done = sum(pool.map(_compile, [c for c in chunks if c]))
    except Exception as e:  # then each compiles at its first timed call
        print(f"parallel compile failed ({e!r}); compiling as the sweep goes")
        return
    print(f"compiled {done} of {len(keys)} kernels in {jobs} processes")


def sweep_shape(name: str, n: int, k: int) -> dict[str, Any]:
    """Every candidate on one shape at SWEEP_ROWS; weights cycled through cold copies."""
    from radixmesh.worker.layers.kernels.fp8_small_m import fp8_small_m_linear
    from radixmesh.worker.layers.quantization.fp8 import quantize_rows

    copies = max(1, math.ceil(COLD_BYTES / (n * k)))
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    ws = [torch.randn(n, k, device="cuda", generator=gen) * 0.02 for _ in range(copies)]
    qs, scales = zip(*(quantize_rows(w) for w in ws), strict=True)
    w16 = [w.to(torch.bfloat16) for w in ws]
    del ws
    res: dict[str, Any] = {
        "shape": name,
        "n": n,
        "k": k,
        "copies": copies,
        "bf16_us": {},
        "configs": [],
    }
    xs = {m: torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16) for m in SWEEP_ROWS}
    refs = {m: F.linear(x.float(), qs[0].float() * scales[0][:, None]) for m, x in xs.items()}
    for m, x in xs.items():
        res["bf16_us"][m] = time_us(functools.partial(_bf16_call, x, w16))
    for cfg in candidates(n, k):
        row: dict[str, Any] = {"config": cfg.entry(), "us": {}, "rel_err": {}}
        try:
            for m, x in xs.items():
                out = fp8_small_m_linear(x, qs[0], scales[0], None, cfg)
                row["rel_err"][m] = rel_err(out, refs[m])
                row["us"][m] = time_us(functools.partial(_fp8_call, x, qs, scales, cfg))
        except Exception as e:  # a config that does not run is reported, not fatal
            row["error"] = repr(e)
        row["ok"] = "error" not in row and max(row["rel_err"].values()) <= MAX_REL_ERR
        row["total_us"] = sum(row["us"].values()) if "error" not in row else None
        res["configs"].append(row)
    res["configs"].sort(key=lambda r: math.inf if r["total_us"] is None else r["total_us"])
    res["best"] = best_of(res["configs"])
    return res


def best_of(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The config that passed the error check with the least total time, if any did."""
    ok = [r for r in rows if r["ok"]]
    return min(ok, key=lambda r: r["total_us"]) if ok else None


def _bf16_call(x: torch.Tensor, ws: list[torch.Tensor], i: int) -> torch.Tensor:
    return F.linear(x, ws[i % len(ws)])


def _fp8_call(
    x: torch.Tensor,
    qs: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    cfg: LaunchConfig,
    i: int,
) -> torch.Tensor:
    from radixmesh.worker.layers.kernels.fp8_small_m import fp8_small_m_linear

    return fp8_small_m_linear(x, qs[i % len(qs)], scales[i % len(qs)], None, cfg)


def print_sweep(results: list[dict[str, Any]]) -> None:
    rows = "/".join(str(m) for m in SWEEP_ROWS)
    for res in results:
        print(f"\n{res['shape']} ({res['n']}, {res['k']}), {res['copies']} weight copies")
        bf16 = "/".join(f"{us:.1f}" for us in res["bf16_us"].values())
        print(f"  bf16 F.linear: {bf16} us at rows {rows}")
        for r in res["configs"]:  # fastest first
            if "error" in r:
                print(f"  {'failed':>20}  {r['config']}  {r['error'][:200]}")
                continue
            us = " ".join(f"{v:6.1f}" for v in r["us"].values())
            flag = "" if r["ok"] else f"  WRONG rel_err {max(r['rel_err'].values()):.1e}"
            print(f"  {us}  {r['config']}{flag}")
    print(f"\nbest per shape (least total us at rows {rows}), for CONFIGS in fp8_small_m.py:")
    for res in results:
        best = res["best"]
        if best is None:
            print(f"    # {res['shape']}: no candidate passed the error check")
            continue
        us = "/".join(f"{v:.1f}" for v in best["us"].values())
        gbps = res["n"] * res["k"] / min(best["us"].values()) / 1e3
        ratio = "/".join(f"{b / res['bf16_us'][m]:.2f}" for m, b in best["us"].items())
        print(
            f"    ({res['n']}, {res['k']}): {best['config']},  # {res['shape']}: {us} us, "
            f"{gbps:.0f} GB/s, {ratio} x bf16"
        )


def sweep(args: argparse.Namespace) -> None:
    every = [c for n, k in SHAPES.values() for c in candidates(n, k)]
    print(f"sweep: {len(every)} configs over {len(SHAPES)} shapes at rows {SWEEP_ROWS}")
    precompile(every, args.jobs)
    results = [sweep_shape(name, n, k) for name, (n, k) in SHAPES.items()]
    print_sweep(results)
    record.write("fp8_gemm", args, {"sweep": results}, name="sweep")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", default="1,4,8,16,64,256", help="comma-separated row counts")
    ap.add_argument("--sweep", action="store_true", help="tune the small-batch kernel's configs")
    ap.add_argument(
        "--jobs", type=int, default=min(16, os.cpu_count() or 1), help="--sweep's compile processes"
    )
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    if args.sweep:
        sweep(args)
        return
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
