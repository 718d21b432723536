"""One mixture-of-experts layer (layers/moe.py): the grouped-GEMM experts (Triton,
layers/kernels/fused_moe.py) against the PyTorch path (one matmul pair per expert with
tokens, the per-expert counts read back), same weights and inputs.

Shapes: Qwen3-30B-A3B's sparse layer (hidden 2,048, 128 experts of 768, 8 a token) and
Mixtral-8x7B's (hidden 4,096, 8 experts of 14,336, 2 a token), random weights, at the rows
of decode steps (1, 16, 256) and of a prefill chunk (2,048). Each pair is first checked
against the other (largest difference relative to the output's largest value), then timed
(median ms of `--repeats` calls after warm-up; CUDA events on a GPU). Also reported: the
bytes of expert weights a call must read (the experts its tokens picked) over its time.

With `--sweep` (CUDA) each shape and row count also times the Triton path at every tile
configuration of a grid (rows, columns and depth per block, warps, stages; the row block
from the mean rows an expert gets), each checked against the PyTorch path first, and
reports the fastest beside the table's own (`CONFIGS` in layers/kernels/fused_moe.py,
which these sweeps set). `--sweep fp8` does the same for FP8 experts' w8a8 path in each
layout (per row, 128 x 128 blocks: `FP8_CONFIGS` serves both) wherever the automatic
choice takes that path (the grid: `fp8_sweep_configs`), `--sweep both` both.

With `--fp8` (CUDA) each shape and row count also times the Triton path with FP8 experts
beside the bf16 one, in two layouts: per output row (what `quantization="fp8"` gives a
bf16 checkpoint at load) and 128 x 128 blocks (Qwen3-30B-A3B-FP8's checkpoint), each
built through the layer's own loaders from the bf16 layer's weights; and in each layout
both paths, weight-only (e4m3 weights, bf16 activations) and w8a8 (activations quantized
on the device, the FP8 MMA), each checked against the bf16 PyTorch path first (the
relative difference is e4m3's rounding of the weights, and for w8a8 of the activations
too), plus the path `fused_experts` picks by itself for the step ("auto": the thresholds
in layers/kernels/fused_moe.py, `W8A8_MIN_MEAN_ROWS`, which these runs set); bytes per
second count one byte a weight. Written to moe-fp8-<machine>.json unless --name or --out
says otherwise.

With `--engine MODEL` (a sparse preset such as dummy:qwen1.5-moe-a2.7b) it also times the
whole engine's batch-1 decoding, ms per token (bench.tp's `decode_latency`), with decode
CUDA graphs and without (`cuda_graph_max_batch_size` 0), each engine in turn; with `--fp8`
too, once more quantized to FP8 (`quantization="fp8"`: FP8 linears and experts) with graphs.

On a CPU only the PyTorch path runs (the Triton path needs CUDA), at Qwen3's shape.
Run: `python -m bench.moe [--dtype bfloat16] [--rows 1,16,256,2048] [--sweep [fp8|both]] [--fp8]
[--engine dummy:qwen1.5-moe-a2.7b]`; prints a table and writes
bench/results/moe-<machine>.json.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from bench import record
from radixmesh.worker.layers.moe import SparseMoE
from radixmesh.worker.layers.weights import get_weight_loader

if TYPE_CHECKING:
    from radixmesh.worker.layers.kernels.fused_moe import GemmConfig

# FP8 layouts timed with --fp8: name -> the quantization method the layer is built for.
FP8_LAYOUTS = {"fp8_rows": "fp8", "fp8_128x128": "fp8-128x128"}
SHAPES = {  # name: (hidden, expert intermediate, experts, top k)
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "mixtral-8x7b": (4096, 14336, 8, 2),
}


def _layer(shape: str, dtype: torch.dtype, device: torch.device) -> SparseMoE:
    h, i, e, k = SHAPES[shape]
    moe = SparseMoE(h, i, e, k, renormalize=True, dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    for p in moe.parameters():
        p.data.normal_(0.0, 0.02, generator=gen)
    return moe


def fp8_layer(moe: SparseMoE, method: str) -> SparseMoE:
    """A copy of `moe` with FP8 experts quantized at load as `method` gives them, each
    expert's gate, up and down handed to the layer's loaders as a checkpoint would."""
    from radixmesh.worker.layers.quantization.fp8_experts import checkpoint_block

    h, i, e = moe.hidden_size, moe.expert_size, moe.num_experts
    fp8 = SparseMoE(h, i, e, moe.top_k, renormalize=moe.renormalize, dtype=moe.w13.dtype,
                    device=moe.w13.device)  # fmt: skip
    fp8.gate.weight.data.copy_(moe.gate.weight)
    fp8.use_fp8(checkpoint_block(method))
    load13, load2 = get_weight_loader(fp8.w13), get_weight_loader(fp8.w2)
    for expert in range(e):
        load13(fp8.w13, moe.w13[expert, :i], (expert, 0))
        load13(fp8.w13, moe.w13[expert, i:], (expert, 1))
        load2(fp8.w2, moe.w2[expert], (expert, 0))
    fp8.check_loaded()
    return fp8


def _ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def sweep_configs(mean_rows: float) -> list[GemmConfig]:
    """The grid: row blocks near the mean rows an expert gets (padding past it is work
    for nothing), every column/depth tile, 4 or 8 warps, 3 or 4 stages."""
    from radixmesh.worker.layers.kernels.fused_moe import GemmConfig

    block_ms = [16] if mean_rows < 2 else [16, 64] if mean_rows < 32 else [64, 128]
    tiles = [(32, 128), (64, 64), (64, 128), (128, 64)]
    return [
        GemmConfig(m, n, k, warps, stages)
        for m, (n, k), warps, stages in itertools.product(block_ms, tiles, (4, 8), (3, 4))
    ]


def fp8_sweep_configs(mean_rows: float) -> list[GemmConfig]:
    """The w8a8 grid (`FP8_CONFIGS`' candidates): row blocks near the mean rows an expert
    gets, 64 or 128 output columns, a 128-deep K step (one 128 x 128 scale block and one
    activation group a step), 4 or 8 warps, 3 or 4 stages."""
    from radixmesh.worker.layers.kernels.fused_moe import GemmConfig

    block_ms = [16, 32, 64] if mean_rows < 32 else [64, 128]
    return [
        GemmConfig(m, n, 128, warps, stages)
        for m, n, warps, stages in itertools.product(block_ms, (64, 128), (4, 8), (3, 4))
    ]


def row(
    shape: str,
    rows: int,
    moe: SparseMoE,
    repeats: int,
    sweep: str | None,
    fp8: dict[str, SparseMoE] | None = None,
) -> dict[str, Any]:
    device = moe.w13.device
    gen = torch.Generator(device=device).manual_seed(rows)
    x = torch.randn(rows, moe.w13.shape[2], generator=gen, device=device).to(moe.w13.dtype)
    experts, weights = moe.route(x)
    picked = int(experts.unique().numel())
    weight_bytes = picked * (moe.w13[0].numel() + moe.w2[0].numel()) * moe.w13.element_size()
    eager = moe.forward_eager(x, experts, weights)
    out: dict[str, Any] = {"shape": shape, "rows": rows, "experts_picked": picked}
    out["eager_ms"] = _ms(lambda: moe.forward_eager(x, experts, weights), device, repeats)
    out["eager_tb_s"] = weight_bytes / out["eager_ms"] / 1e9
    if device.type == "cuda":
        from radixmesh.worker.layers.kernels.fused_moe import fused_experts

        def fused() -> torch.Tensor:
            return fused_experts(x, moe.w13, moe.w2, experts, weights)

        scale = float(eager.float().abs().max())
        out["rel_diff"] = float((fused().float() - eager.float()).abs().max()) / scale
        out["fused_ms"] = _ms(fused, device, repeats)
        out["fused_tb_s"] = weight_bytes / out["fused_ms"] / 1e9
        out["fused_speedup"] = out["eager_ms"] / out["fused_ms"]
        for name, layer in (fp8 or {}).items():
            out[name] = _fp8_row(layer, x, experts, weights, eager, scale, repeats)
            for path in FP8_PATHS:
                timed = out[name][path]
                timed["tb_s"] = weight_bytes / moe.w13.element_size() / timed["ms"] / 1e9
                timed["vs_bf16"] = out["fused_ms"] / timed["ms"]
        mean = rows * experts.shape[1] / moe.num_experts
        if sweep in ("bf16", "both"):

            def bf16(config: GemmConfig) -> torch.Tensor:
                return fused_experts(x, moe.w13, moe.w2, experts, weights, config)

            out["sweep"] = _sweep(bf16, sweep_configs(mean), eager, scale, repeats, 0.05)
            out["best"] = _fastest(out["sweep"])
            out["best_vs_table"] = out["fused_ms"] / out["best"]["ms"]
        for name, layer in (fp8 or {}).items() if sweep in ("fp8", "both") else ():
            timed = out[name]
            if timed["auto"] == "w8a8":  # the path the table's tiles serve
                timed["sweep"] = _sweep(
                    _w8a8(layer, x, experts, weights), fp8_sweep_configs(mean), eager, scale,
                    repeats, FP8_GATES["w8a8"],
                )  # fmt: skip
                timed["best"] = _fastest(timed["sweep"])
                timed["best_vs_table"] = timed["w8a8"]["ms"] / timed["best"]["ms"]
    return out


def _w8a8(
    moe: SparseMoE, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
) -> Callable[[GemmConfig], torch.Tensor]:
    from radixmesh.worker.layers.kernels.fused_moe import fused_experts

    scales = moe.scales()

    def fused(config: GemmConfig) -> torch.Tensor:
        return fused_experts(
            x, moe.w13, moe.w2, experts, weights, config, scales=scales, fp8_activations=True
        )

    return fused


def _fastest(results: list[dict[str, Any]]) -> dict[str, Any]:
    return min(results, key=lambda r: r.get("ms", float("inf")))


# The FP8 paths timed with --fp8 (fused_experts' `fp8_activations`) and the largest
# relative difference from the bf16 PyTorch path each may show. e4m3's rounding of the
# bench's random weights moves the output 4.2-4.7% of its largest value, rounding the
# activations too 5.5-6.0% (both layouts, 16 and 256 rows: PyTorch computing each path's
# math on CPU at Qwen3's shape). A misplaced scale moves it by the scale's own size
# (order 1): both gates stay well under that, with room over the rounding.
FP8_PATHS = {"weight_only": False, "w8a8": True}
FP8_GATES = {"weight_only": 0.2, "w8a8": 0.25}


def _fp8_row(
    moe: SparseMoE,
    x: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    eager: torch.Tensor,
    scale: float,
    repeats: int,
) -> dict[str, Any]:
    """The FP8 experts' grouped GEMMs on the bf16 layer's inputs and routing, on each path
    (weight-only, w8a8): relative difference from the bf16 PyTorch path, then ms; and
    which path `fused_experts` picks for the step by itself ("auto")."""
    from radixmesh.worker.layers.kernels.fused_moe import fused_experts, use_fp8_activations

    scales = moe.scales()
    out: dict[str, Any] = {
        "auto": "w8a8"
        if use_fp8_activations(x.shape[0], experts.shape[1], moe.w13, moe.w2, scales)
        else "weight_only"
    }
    for path, fp8_activations in FP8_PATHS.items():

        def fused(fp8_activations: bool = fp8_activations) -> torch.Tensor:
            return fused_experts(
                x, moe.w13, moe.w2, experts, weights, scales=scales, fp8_activations=fp8_activations
            )

        diff = float((fused().float() - eager.float()).abs().max()) / scale
        if diff > FP8_GATES[path]:
            raise AssertionError(
                f"FP8 experts ({path}): relative difference {diff:.3g} from the bf16 path"
            )
        out[path] = {"rel_diff": diff, "ms": _ms(fused, x.device, repeats)}
    return out


def _sweep(
    fused: Callable[[GemmConfig], torch.Tensor],
    configs: list[GemmConfig],
    eager: torch.Tensor,
    scale: float,
    repeats: int,
    gate: float,
) -> list[dict[str, Any]]:
    """Each config's ms, after its output is checked against the PyTorch path's (largest
    difference over the output's largest value at most `gate`); a tile the GPU cannot
    hold (shared memory) is kept as its error."""
    results = []
    for config in configs:
        entry: dict[str, Any] = {"config": list(vars(config).values())}
        try:
            diff = float((fused(config).float() - eager.float()).abs().max()) / scale
        except Exception as e:  # a tile the GPU cannot hold (shared memory): skipped
            entry["error"] = f"{type(e).__name__}: {e}"[:200]
            results.append(entry)
            continue
        if diff > gate:
            raise AssertionError(f"{config}: relative difference {diff:.3g} from the eager path")
        entry["ms"] = _ms(functools.partial(fused, config), eager.device, repeats)
        results.append(entry)
    return results


def engine_decode(
    model: str, dtype: str, device: torch.device, fp8: bool = False
) -> list[dict[str, Any]]:
    """Batch-1 ms per token of `model`'s engine with decode graphs (CUDA) and without,
    and with `fp8` once more quantized to FP8 (FP8 linears and experts) with graphs."""
    from bench.tp import decode_latency
    from radixmesh.worker.engine import Engine

    prompt = [(7 * j) % 500 + 3 for j in range(128)]
    runs = []
    cases: list[tuple[int, str | None]] = (
        [(8, None), (0, None)] if device.type == "cuda" else [(0, None)]
    )
    if fp8 and device.type == "cuda":
        cases.append((8, "fp8"))
    for graphs, quantization in cases:
        engine = Engine(
            model,
            device=device.type,
            dtype=dtype,
            cuda_graph_max_batch_size=graphs,
            kv_cache_tokens=4096,
            max_running_requests=8,
            quantization=quantization,
        )
        try:
            decode_latency(engine, prompt, 8)  # warm-up: compiles, autotuning
            runs.append(
                {
                    "model": model,
                    "graphs": bool(graphs),
                    "quantization": quantization,
                    **decode_latency(engine, prompt, 64),
                }
            )
        finally:
            engine.shutdown()
        del engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return runs


def _print_fp8(results: list[dict[str, Any]]) -> None:
    """One line a shape and row count: bf16's ms, then per FP8 layout each path's ms (its
    speed-up over bf16, its relative difference) and the path the automatic choice takes."""
    heads = [f"{n} {p} ms (vs bf16, rel diff)" for n in FP8_LAYOUTS for p in FP8_PATHS]
    heads += [f"{n} auto" for n in FP8_LAYOUTS]
    print("\nshape | rows | bf16 ms | " + " | ".join(heads))
    for r in results:
        cells = [
            f"{r[n][p]['ms']:.3f} ({r[n][p]['vs_bf16']:.2f}x, {r[n][p]['rel_diff']:.2g})"
            for n in FP8_LAYOUTS
            for p in FP8_PATHS
        ]
        cells += [r[n]["auto"] for n in FP8_LAYOUTS]
        print(f"{r['shape']} | {r['rows']} | {r['fused_ms']:.3f} | " + " | ".join(cells))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    record.add_output_arguments(ap)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rows", default="1,16,256,2048", help="tokens per call, comma-separated")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument(
        "--sweep",
        nargs="?",
        const="bf16",
        choices=["bf16", "fp8", "both"],
        help="time a grid of tile configs (CUDA): bf16 experts' (the default), the FP8 "
        "w8a8 path's (implies --fp8), or both",
    )
    ap.add_argument(
        "--fp8", action="store_true", help="also time FP8 experts beside bf16 ones (CUDA)"
    )
    ap.add_argument(
        "--engine", default=None, help="a sparse model: batch-1 decoding, graphs on/off"
    )
    ap.add_argument("--skip-layer", action="store_true", help="only the --engine part")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    shapes = list(SHAPES) if device.type == "cuda" else ["qwen3-30b-a3b"]
    results: list[dict[str, Any]] = []
    sweep = args.sweep if device.type == "cuda" else None
    fp8 = (args.fp8 or sweep in ("fp8", "both")) and device.type == "cuda"
    for shape in [] if args.skip_layer else shapes:
        moe = _layer(shape, dtype, device)
        layers = (
            {name: fp8_layer(moe, method) for name, method in FP8_LAYOUTS.items()} if fp8 else None
        )
        results += [
            row(shape, int(r), moe, args.repeats, sweep, layers) for r in args.rows.split(",")
        ]
        del moe, layers
    if results:
        print("shape | rows | experts picked | eager ms | fused ms | fused speedup | rel diff")
    for r in results:
        fused = "- | - | -"
        if "fused_ms" in r:
            fused = f"{r['fused_ms']:.3f} | {r['fused_speedup']:.2f}x | {r['rel_diff']:.2g}"
        print(f"{r['shape']} | {r['rows']} | {r['experts_picked']} | {r['eager_ms']:.3f} | {fused}")
    if fp8 and results:
        _print_fp8(results)
    if any("best" in r for r in results):
        print("\nshape | rows | table ms | best ms | best config (m, n, k, warps, stages)")
        for r in results:
            b = r["best"]
            print(
                f"{r['shape']} | {r['rows']} | {r['fused_ms']:.3f} | {b['ms']:.3f} | {b['config']}"
            )
    for name in FP8_LAYOUTS:
        swept = [r for r in results if "best" in r.get(name, {})]
        if swept:
            print(f"\n{name} w8a8: shape | rows | table ms | best ms | best config")
        for r in swept:
            b, table = r[name]["best"], r[name]["w8a8"]["ms"]
            print(f"{r['shape']} | {r['rows']} | {table:.3f} | {b['ms']:.3f} | {b['config']}")
    figures: dict[str, Any] = {"device": device.type, "dtype": args.dtype, "rows": results}
    if args.engine:
        figures["engine"] = engine_decode(args.engine, args.dtype, device, fp8)
        print("\nmodel | weights | decode graphs | ms per token (batch 1)")
        for r in figures["engine"]:
            weights = r["quantization"] or args.dtype
            graphs = "on" if r["graphs"] else "off"
            print(f"{r['model']} | {weights} | {graphs} | {r['ms_per_token']:.2f}")
    record.write("moe", args, figures, name="fp8" if fp8 else None)


if __name__ == "__main__":
    main()
