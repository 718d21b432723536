"""`python -m bench.fp8_gemm --sweep`: the small-batch FP8 kernel's launch configs, timed.

Every candidate (`candidates`: the dot and gemv variants, column blocks 16-64, K tiles
128-512, split-K 1-8, then persistent grids of the fastest few) on each of Llama-3-8B's
four shapes at 1, 4 and 16 rows, with the scale layout the engine quantizes to
(`--layout`, default fp8.DEFAULT_LAYOUT), checked against float32 on the dequantized
weights (a config whose relative error passes MAX_REL_ERR is reported and never chosen),
timed with CUDA graphs of 20 calls, median of 9, the weights cycled through copies that
outgrow the L2 cache (a decode step reads every layer's weights once: none is in L2 when
its GEMM runs). bf16 F.linear is timed the same way beside it, and the shape's current
config (`config_for`) as "current".

It prints the table with each row's effective TB/s (FP8 weight bytes / time), then per
shape the config with the least total time over the row counts, for `CONFIGS` in
layers/kernels/fp8_small_m.py, and per row bucket a config that beats that one by more
than ROW_GAIN, for `ROW_CONFIGS`; and writes `fp8_gemm-sweep-<machine>.json`.

Bounded (`--budget-s`, default 200 s, on an H200 with 16 compile processes): the kernels
compile first in `--jobs` processes (Triton's disk cache keeps them for this one), and
candidates not timed by the deadline are reported as skipped, the persistent stage first.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import torch
import torch.nn.functional as F

from bench import record
from radixmesh.worker.layers.kernels.fp8_small_m import (
    MAX_ROWS,
    ROW_BUCKETS,
    LaunchConfig,
    config_for,
    fp8_small_m_linear,
)
from radixmesh.worker.layers.kernels.timing import time_us
from radixmesh.worker.layers.quantization.fp8 import DEFAULT_LAYOUT
from radixmesh.worker.layers.quantization.fp8_gemm_choice import rel_err
from radixmesh.worker.layers.quantization.fp8_scales import SCALE_LAYOUTS, dequantize_rows, quantize

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
SWEEP_ROWS = ROW_BUCKETS  # 1, 4, 16: each bucket's largest row count
# Weight copies a sweep cycles through outgrow this (the H200's L2 is 50 MB).
COLD_BYTES = 128 << 20
# The H100 / H200's shared memory a block may take (227 KiB).
SHARED_LIMIT = 227 << 10
SMS = 132
# bfloat16 output against float32: a few bf16 ulps of the result's norm at most.
MAX_REL_ERR = 4e-3
# A gemv tile's float32 products per thread, at most: more spills registers.
GEMV_PRODUCTS_PER_THREAD = 256
# A bucket's own config must beat the shape's config by this much to be listed.
ROW_GAIN = 0.03
# Persistent grids are tried on this many of a shape's fastest configs.
PERSISTENT_TOP = 3
PROGRAMS_PER_SM = (1, 2, 4)


def tbps(n: int, k: int, us: float, itemsize: int = 1) -> float:
    """Effective TB/s: the weight's bytes (FP8: 1 a weight, bf16: 2) over the time."""
    return n * k * itemsize / us / 1e6


def fits(cfg: LaunchConfig, rows: int) -> bool:
    """Whether `cfg` is worth timing at `rows` rows: a gemv tile's products per thread
    stay in registers (its row block is the next power of two)."""
    if cfg.variant != "gemv":
        return True
    block_m = 1 << (rows - 1).bit_length()
    return block_m * cfg.block_n * cfg.block_k <= GEMV_PRODUCTS_PER_THREAD * 32 * cfg.num_warps


def _splits(cfg: LaunchConfig, n: int, k: int, sms: int) -> list[LaunchConfig]:
    """`cfg` with K split 1-8 ways while the shape stays under 8 programs per SM and each
    slice keeps 2 K tiles."""
    blocks = math.ceil(n / cfg.block_n)
    out = []
    for split in (1, 2, 4, 8):
        if split > 1 and (blocks * split > 8 * sms or k < split * 2 * cfg.block_k):
            continue
        out.append(LaunchConfig(**{**cfg.__dict__, "split_k": split}))
    return out


def candidates(n: int, k: int, sms: int = SMS) -> list[LaunchConfig]:
    """Launch configs worth timing on (n, k), one program per tile:
    dot: column blocks 16-64, K tiles 128-512, 3-5 stages, 8 warps only on tiles of
      32 x 256 and up, 16-column blocks only at 3 stages and K tiles of 256 and 512;
    gemv: column blocks 16-64, K tiles 128-512 (wider loads, few columns: many programs),
      2-3 stages, 4 warps (8 on K tiles of 512);
    each with split-K (`_splits`) where shared memory fits."""
    tiles: list[LaunchConfig] = []
    for bn, bk, warps, stages in itertools.product(
        (16, 32, 64), (128, 256, 512), (4, 8), (3, 4, 5)
    ):
        if bn == 16 and (bk == 128 or warps == 8 or stages != 3):
            continue
        if warps == 8 and bn * bk < 32 * 256:
            continue
        tiles.append(LaunchConfig(bn, bk, 1, warps, stages))
    for bn, bk, stages in itertools.product((16, 32, 64), (128, 256, 512), (2, 3)):
        warps = 8 if bk == 512 else 4
        tiles.append(LaunchConfig(bn, bk, 1, warps, stages, variant="gemv"))
    out = [c for t in tiles for c in _splits(t, n, k, sms)]
    return [c for c in out if c.shared_bytes() <= SHARED_LIMIT]


def persistent(configs: Sequence[LaunchConfig], n: int, sms: int = SMS) -> list[LaunchConfig]:
    """Persistent grids of `configs` where they have more tiles than programs."""
    out = []
    for cfg in configs:
        tiles = math.ceil(n / cfg.block_n) * cfg.split_k
        for pps in PROGRAMS_PER_SM:
            if pps * sms < tiles:
                out.append(LaunchConfig(**{**cfg.__dict__, "programs_per_sm": pps}))
    return out


def compile_keys(configs: Sequence[LaunchConfig]) -> list[LaunchConfig]:
    """One config per distinct compiled GEMM kernel: the variant, tiles, warps, stages,
    whether K is split and whether the grid is persistent (the summing kernel's few
    variants compile at their first use)."""
    seen: dict[tuple[Any, ...], LaunchConfig] = {}
    for c in configs:
        key = (c.variant, c.block_n, c.block_k, c.num_warps, c.num_stages, c.split_k > 1)
        seen.setdefault((*key, c.programs_per_sm > 0), c)
    return list(seen.values())


def _compile(layout: str, configs: list[LaunchConfig]) -> int:
    """Run each config once at a shape whose Triton specialization is the Llama shapes'
    (every size, stride and block count a multiple of 16; K a multiple of each K tile;
    more tiles than a persistent grid's programs), at each row block it is timed with:
    the compiled kernels land in Triton's disk cache for the timing process."""
    x = torch.zeros(MAX_ROWS, 2048, device="cuda", dtype=torch.bfloat16)
    q, scale = quantize(torch.zeros(65536, 2048, device="cuda"), layout)
    done = 0
    for cfg in configs:
        try:
            for rows in SWEEP_ROWS if cfg.variant == "gemv" else (1,):
                if fits(cfg, rows):
                    fp8_small_m_linear(x[:rows], q, scale, None, cfg)
            done += 1
        except Exception:  # the timing process reports it, with its error
            pass
    torch.cuda.synchronize()
    return done


def precompile(configs: Sequence[LaunchConfig], layout: str, jobs: int) -> None:
    keys = compile_keys(configs)
    if jobs <= 1:
        return  # each compiles at its first timed call
    chunks = [c for c in (keys[i::jobs] for i in range(jobs)) if c]
    try:
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            done = sum(pool.map(functools.partial(_compile, layout), chunks))
    except Exception as e:  # then each compiles at its first timed call
        print(f"parallel compile failed ({e!r}); compiling as the sweep goes")
        return
    print(f"compiled {done} of {len(keys)} kernels in {jobs} processes", flush=True)


class Shape:
    """One GEMM shape's operands: cold weight copies, rows, float32 references."""

    def __init__(self, name: str, n: int, k: int, layout: str) -> None:
        self.name, self.n, self.k = name, n, k
        self.copies = max(1, math.ceil(COLD_BYTES / (n * k)))
        gen = torch.Generator(device="cuda").manual_seed(n + k)
        ws = [torch.randn(n, k, device="cuda", generator=gen) * 0.02 for _ in range(self.copies)]
        self.qs, self.scales = zip(*(quantize(w, layout) for w in ws), strict=True)
        self.w16 = [w.to(torch.bfloat16) for w in ws]
        del ws
        self.xs = {
            m: torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            for m in SWEEP_ROWS
        }
        w0 = dequantize_rows(self.qs[0], self.scales[0], torch.float32)
        self.refs = {m: F.linear(x.float(), w0) for m, x in self.xs.items()}

    def time_config(self, cfg: LaunchConfig, label: str = "") -> dict[str, Any]:
        row: dict[str, Any] = {"config": cfg.entry(), "us": {}, "rel_err": {}}
        if label:
            row["label"] = label
        try:
            for m, x in self.xs.items():
                if not fits(cfg, m):
                    continue
                out = fp8_small_m_linear(x, self.qs[0], self.scales[0], None, cfg)
                row["rel_err"][m] = rel_err(out, self.refs[m])
                row["us"][m] = time_us(functools.partial(self._fp8_call, x, cfg))
        except Exception as e:  # a config that does not run is reported, not fatal
            row["error"] = repr(e)
        errs = row["rel_err"].values()
        row["ok"] = "error" not in row and bool(errs) and max(errs) <= MAX_REL_ERR
        full = "error" not in row and len(row["us"]) == len(SWEEP_ROWS)
        row["total_us"] = sum(row["us"].values()) if full else None
        return row

    def _fp8_call(self, x: torch.Tensor, cfg: LaunchConfig, i: int) -> torch.Tensor:
        j = i % self.copies
        return fp8_small_m_linear(x, self.qs[j], self.scales[j], None, cfg)

    def bf16_us(self) -> dict[int, float]:
        return {m: time_us(functools.partial(self._bf16_call, x)) for m, x in self.xs.items()}

    def _bf16_call(self, x: torch.Tensor, i: int) -> torch.Tensor:
        return F.linear(x, self.w16[i % self.copies])


def sweep_shape(shape: Shape, deadline: float) -> dict[str, Any]:
    """Every candidate on one shape, then persistent grids of its fastest few."""
    res: dict[str, Any] = {"shape": shape.name, "n": shape.n, "k": shape.k}
    res["copies"] = shape.copies
    res["bf16_us"] = shape.bf16_us()
    res["current"] = {m: config_for(shape.n, shape.k, m).entry() for m in SWEEP_ROWS}
    rows = [shape.time_config(config_for(shape.n, shape.k), "current")]
    skipped = 0
    for stage in ("tiles", "persistent"):
        if stage == "tiles":
            todo = candidates(shape.n, shape.k)
        else:
            timed = [r for r in rows if r["ok"] and r["total_us"] is not None]
            timed.sort(key=lambda r: r["total_us"])
            top = [eval(r["config"], {"LaunchConfig": LaunchConfig}) for r in timed]
            todo = persistent(top[:PERSISTENT_TOP], shape.n)
        for cfg in todo:
            if time.monotonic() > deadline:
                skipped += 1
                continue
            rows.append(shape.time_config(cfg))
    res["skipped_for_time"] = skipped
    rows.sort(key=lambda r: math.inf if r["total_us"] is None else r["total_us"])
    res["configs"] = rows
    res["best"] = best_of(rows)
    res["best_by_rows"] = best_by_rows(rows, res["best"])
    return res


def best_of(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The config that passed the error check with the least total time, if any did."""
    ok = [r for r in rows if r["ok"] and r["total_us"] is not None]
    return min(ok, key=lambda r: r["total_us"]) if ok else None


def best_by_rows(rows: list[dict[str, Any]], best: dict[str, Any] | None) -> dict[int, Any]:
    """Per row bucket, the fastest passing config where it beats `best` by ROW_GAIN."""
    out: dict[int, Any] = {}
    for m in SWEEP_ROWS:
        timed = [r for r in rows if r["ok"] and m in r["us"]]
        if not timed or best is None:
            continue
        top = min(timed, key=lambda r: r["us"][m])
        if top["us"][m] < best["us"][m] * (1 - ROW_GAIN):
            out[m] = {"config": top["config"], "us": top["us"][m], "shape_us": best["us"][m]}
    return out


def print_sweep(results: list[dict[str, Any]]) -> None:
    rows = "/".join(str(m) for m in SWEEP_ROWS)
    for res in results:
        n, k = res["n"], res["k"]
        print(f"\n{res['shape']} ({n}, {k}), {res['copies']} weight copies")
        bf16 = "/".join(f"{us:.1f}" for us in res["bf16_us"].values())
        bf16_tb = "/".join(f"{tbps(n, k, us, 2):.2f}" for us in res["bf16_us"].values())
        print(f"  bf16 F.linear: {bf16} us at rows {rows}, {bf16_tb} TB/s")
        for r in res["configs"]:  # fastest first
            if "error" in r:
                print(f"  {'failed':>20}  {r['config']}  {r['error'][:200]}")
                continue
            us = " ".join(f"{r['us'][m]:6.1f}" if m in r["us"] else "     -" for m in SWEEP_ROWS)
            tb = tbps(n, k, min(r["us"].values())) if r["us"] else 0.0
            flag = "" if r["ok"] else "  WRONG rel_err"
            label = f" ({r['label']})" if "label" in r else ""
            print(f"  {us}  {tb:4.2f} TB/s  {r['config']}{label}{flag}")
        if res.get("skipped_for_time"):
            print(f"  {res['skipped_for_time']} candidates skipped: out of time")
    print(f"\nbest per shape (least total us at rows {rows}), for CONFIGS in fp8_small_m.py:")
    for res in results:
        best, n, k = res["best"], res["n"], res["k"]
        if best is None:
            print(f"    # {res['shape']}: no candidate passed the error check")
            continue
        times = "/".join(f"{v:.1f}" for v in best["us"].values())
        tb_text = "/".join(f"{tbps(n, k, v):.2f}" for v in best["us"].values())
        ratio = "/".join(f"{b / res['bf16_us'][m]:.2f}" for m, b in best["us"].items())
        print(f"    # {res['shape']}: {times} us, {tb_text} TB/s, {ratio}x bf16")
        print(f"    ({n}, {k}): {best['config']},")
    print("\nbest per row bucket where it beats the shape's config, for ROW_CONFIGS:")
    for res in results:
        for m, b in res.get("best_by_rows", {}).items():
            gain = f"{b['us']:.1f} us ({tbps(res['n'], res['k'], b['us']):.2f} TB/s)"
            print(f"    # {res['shape']} at rows <= {m}: {gain} vs {b['shape_us']:.1f}")
            print(f"    ({res['n']}, {res['k']}, {m}): {b['config']},")


def sweep(args: argparse.Namespace) -> None:
    started = time.monotonic()
    deadline = started + args.budget_s
    every = [c for n, k in SHAPES.values() for c in candidates(n, k)]
    # Persistent grids of any tile config may be timed: compile those keys too (cheap:
    # the compile keys ignore the split count and the shape).
    every += persistent(compile_keys(every), 1 << 20)
    print(f"sweep: {len(every)} configs over {len(SHAPES)} shapes at rows {SWEEP_ROWS}, "
          f"{args.layout} scales", flush=True)  # fmt: skip
    precompile(every, args.layout, args.jobs)
    print(f"[{time.monotonic() - started:.0f} s] compiled", flush=True)
    results = []
    for name, (n, k) in SHAPES.items():
        results.append(sweep_shape(Shape(name, n, k, args.layout), deadline))
        print(f"[{time.monotonic() - started:.0f} s] {name} timed", flush=True)
    print_sweep(results)
    payload = {"layout": args.layout, "seconds": time.monotonic() - started, "sweep": results}
    record.write("fp8_gemm", args, payload, name="sweep")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--layout", default=DEFAULT_LAYOUT, choices=SCALE_LAYOUTS,
                    help="--sweep's weight scales")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=200.0,
                    help="--sweep stops timing candidates after this many seconds")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                    help="--sweep's compile processes")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.fp8_sweep`: the sweep alone (as `python -m bench.fp8_gemm --sweep`)."""
    ap = argparse.ArgumentParser(description=__doc__)
    add_arguments(ap)
    record.add_output_arguments(ap)
    sweep(ap.parse_args(argv))


if __name__ == "__main__":
    main()
