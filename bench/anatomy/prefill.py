"""`step_anatomy --workload prefill`: where a prefill-heavy step's time goes on the GPU.

bench/offline.py's two GPU workloads (`throughput`: 256 x 512 random prompt tokens, 256
new; `shared_prefix`: 1,024 requests in 16 groups sharing a 1,536-token prefix, 64 own
tokens, 8 new; `--requests` keeps a prefix of each), each run once as a warm-up and once
under torch.profiler (record_shapes), started on the scheduler thread (the profiler
records CPU ops per thread; CUPTI sees every kernel). The throughput run stops profiling
after `--decode-steps` decode steps (default 64) once every prompt is in: one decode step
showed neither a decode tail (mean against median) nor the idle GPU between steps. The
trace grows with the steps it holds (record_shapes keeps every op's input sizes; a batch-256
decode step is ~1,000 CPU ops and as many kernels), so the window is capped at 512 steps.

Each engine step (one `Scheduler.step` call) is classified by the batch it launched:
prefill (prompt rows only), mixed (prompt and decode rows) or decode. A kernel belongs to
the step in which it was launched (its CUDA runtime/driver call lies in the step's
`anatomy::step` range; failing that, its GPU start does), and to a GEMM shape through the
CPU op it was launched under (aten::mm / addmm: M x N x K from the recorded shapes).
Categories: gemm, attention (Triton extend / decode kernels), kv_store, norm, rotary,
activation (fused Triton kernels), sampling (launched inside `Sampler.draw`), copy, other.
Per step kind: host wall (the `Scheduler.step` call; with the overlap scheduler it also
waits for the previous step), GPU span (first kernel of the step to the next step's
first), GPU busy (union of kernel intervals), the median / mean / p90 / max of wall and of
idle GPU (span - busy) over the kind's steps, the host phases' shares of the wall
(schedule; launch: building the inputs and launching the forward; process_output without
its wait; wait: `PendingTokens.token_ids` blocking for a step's sampled ids; other: the
rest of the call; and apart, gc: the cyclic collector's pauses inside the step, whichever
phase they interrupted), time by category, GEMMs by shape with
TFLOP/s against `--matmul-tflops`, attention FLOPs (causal over the new tokens plus the
cached prefix) and the floor: (GEMM + attention FLOPs) / matmul rate, with the gap split
into GEMM and attention excess over their floors, the other categories, and idle GPU.
On CPU the "kernels" are the scheduler thread's innermost GEMM ops and other leaf ops.

The engine freezes what its start-up built out of the collector (`gc_freeze`, the
engine's default; `--no-gc-freeze` turns it off): a full collection otherwise walks the
model, tokenizer and pools in the middle of a step (130-230 ms on the 2-core CPU machine).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from typing import Any

from bench.anatomy.kernel_trace import (
    StepKernels,
    assign,
    gemm_mnk,
    kernels,
    step_figures,
    trace_events,
    windows,
)
from bench.anatomy.recorder import StepInfo, StepRecorder
from bench.offline import Workload, gpu_workloads
from radixmesh.worker.engine import Engine

__all__ = ["StepInfo", "StepRecorder", "distribution", "phase_shares", "prefill", "summarize"]

CATEGORIES = (
    "gemm",
    "attention",
    "kv_store",
    "norm",
    "rotary",
    "activation",
    "sampling",
    "copy",
    "other",
)
KINDS = ("prefill", "mixed", "decode")
EXTEND = "_extend_kernel"
MAX_DECODE_STEPS = 512  # the profiled window's cap: the trace lives in the host's memory
SHARES = ("schedule", "launch", "process_output", "wait", "other")


# ---- per step kind ---------------------------------------------------------------------


def gemm_shapes(steps: list[StepKernels], tflops: float) -> list[dict[str, Any]]:
    """GEMMs of these steps by M x N x K: FLOPs once per op, time summed over kernels."""
    ms: dict[str, float] = defaultdict(float)
    flops: dict[str, float] = defaultdict(float)
    ops: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for s in steps:
        for k, cat in s.kernels:
            if cat != "gemm":
                continue
            mnk = gemm_mnk(k.op) if k.op is not None else None
            key = "x".join(map(str, mnk)) if mnk else "unknown"
            ms[key] += (k.end - k.start) / 1e6
            op_id = (k.op.corr, k.op.start) if k.op is not None else (0, k.start)
            if mnk and op_id not in ops[key]:
                flops[key] += 2.0 * mnk[0] * mnk[1] * mnk[2]
            ops[key].add(op_id)
    rows = [
        {"mnk": key, "calls": len(ops[key]), "ms": ms[key], "tflop": flops[key] / 1e12}
        | _rate(flops[key], ms[key], tflops)
        for key in ms
    ]
    return sorted(rows, key=lambda r: -r["ms"])


def _rate(flop: float, ms: float, tflops: float) -> dict[str, float]:
    achieved = flop / (ms * 1e9) if ms > 0 else 0.0
    return {"tflops": achieved, "fraction_of_matmul": achieved / tflops}


def attention_flops(info: StepInfo, arch: Any) -> tuple[float, float]:
    """(prompt rows, decode rows): QK^T and PV over every key a query reads, causal."""
    per_key = 4.0 * arch.head_size * arch.num_attention_heads * arch.num_hidden_layers
    return per_key * info.extend_keys, per_key * info.decode_keys


def kind_summary(
    steps: list[StepKernels], figs: list[dict[str, Any]], arch: Any, tflops: float
) -> dict[str, Any]:
    """One step kind: means per step, totals, GEMM shapes, attention and the floor."""
    n = len(steps)
    infos = [s.info for s in steps]
    mean = lambda xs: sum(xs) / n  # noqa: E731
    cats = {c: mean([f["by_category_ms"].get(c, 0.0) for f in figs]) for c in CATEGORIES}
    phases = sorted({p for i in infos for p in i.phases})
    shapes = gemm_shapes(steps, tflops)
    gemm_flop = sum(r["tflop"] for r in shapes) * 1e12 / n
    att = [attention_flops(i, arch) for i in infos]
    ext_flop, dec_flop = mean([a for a, _ in att]), mean([d for _, d in att])
    attn_ms = cats["attention"]
    floor_ms = (gemm_flop + ext_flop + dec_flop) / (tflops * 1e9)
    span, busy = mean([f["span_ms"] for f in figs]), mean([f["busy_ms"] for f in figs])
    host = {p: mean([i.phases.get(p, 0.0) for i in infos]) for p in phases}
    wall = mean([i.wall_ms for i in infos])
    return {
        "steps": n,
        "graphed_steps": sum(i.graphed for i in infos),
        "tokens_per_step": mean([i.tokens for i in infos]),
        "tokens": sum(i.tokens for i in infos),
        "prompt_tokens": sum(i.prompt_tokens for i in infos),
        "cached_prefix_tokens": sum(i.cached_tokens for i in infos),
        "decode_rows": sum(i.decode_rows for i in infos),
        "wall_ms": wall,
        "wall_ms_dist": distribution([i.wall_ms for i in infos]),
        "idle_ms_dist": distribution([f["span_ms"] - f["busy_ms"] for f in figs]),
        "host_phase_ms": host,
        "host_phase_share": phase_shares(host, wall),
        "kernels_per_step": mean([f["kernels"] for f in figs]),
        "span_ms": span,
        "busy_ms": busy,
        "by_category_ms": cats,
        "gemm_shapes": shapes,
        "attention": {
            "tflop_prompt_rows": ext_flop / 1e12,
            "tflop_decode_rows": dec_flop / 1e12,
            "ms": attn_ms,
        }
        | _rate(ext_flop + dec_flop, attn_ms, tflops)
        | _extend_kernel(steps, ext_flop, tflops),
        "floor_ms": floor_ms,
        "gap_ms": _gap(cats, span, busy, gemm_flop, ext_flop + dec_flop, tflops),
    }


def distribution(values: list[float]) -> dict[str, float]:
    """Median, mean, p90 (nearest rank) and max: a tail shows as mean and p90 over median."""
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "mean": statistics.fmean(ordered),
        "p90": ordered[max(0, -(-9 * len(ordered) // 10) - 1)],
        "max": ordered[-1],
    }


def phase_shares(host: dict[str, float], wall: float) -> dict[str, float]:
    """Each host phase's share of a step call's wall time (means per step). Launch holds
    the forward's host part (inputs, kernel launches, sampling's launch); process_output
    is counted without its wait for the sampled ids, which is its own share."""
    if wall <= 0:
        return dict.fromkeys(SHARES, 0.0)
    wait = host.get("wait", 0.0)
    ms = {
        "schedule": host.get("schedule", 0.0),
        "launch": host.get("launch", 0.0),
        "process_output": host.get("process_output", 0.0) - wait,
        "wait": wait,
    }
    ms["other"] = wall - sum(ms.values())
    return {p: v / wall for p, v in ms.items()}


def _extend_kernel(steps: list[StepKernels], flop: float, tflops: float) -> dict[str, float]:
    """The Triton extend kernel alone (ms per step) against the prompt rows' FLOPs; {} on
    CPU (the torch backend has no such kernel)."""
    ms = sum((k.end - k.start) / 1e6 for s in steps for k, _ in s.kernels if EXTEND in k.name)
    if not ms:
        return {}
    ms /= len(steps)
    rate = _rate(flop, ms, tflops)
    return {"extend_kernel_ms": ms, "extend_kernel_tflops": rate["tflops"]}


def _gap(
    cats: dict[str, float], span: float, busy: float, gemm: float, attn: float, tflops: float
) -> dict[str, float]:
    """span - floor, term by term: each matmul-bound category's excess over its floor,
    the other categories whole, the GPU's idle time, less kernels that overlapped."""
    gap = {
        "gemm_excess": cats["gemm"] - gemm / (tflops * 1e9),
        "attention_excess": cats["attention"] - attn / (tflops * 1e9),
    }
    gap |= {c: cats[c] for c in CATEGORIES if c not in ("gemm", "attention")}
    gap["idle"] = span - busy
    gap["concurrent"] = busy - sum(cats.values())
    return gap


def summarize(steps: list[StepKernels], arch: Any, tflops: float) -> dict[str, dict[str, Any]]:
    figs = step_figures(steps)
    out = {}
    for kind in KINDS:
        idx = [i for i, s in enumerate(steps) if s.info.kind == kind]
        if idx:
            out[kind] = kind_summary([steps[i] for i in idx], [figs[i] for i in idx], arch, tflops)
    return out


def warmup_summary(steps: list[StepInfo]) -> dict[str, dict[str, Any]]:
    """The unprofiled run: steps, tokens and host wall per step kind."""
    out = {}
    for kind in KINDS:
        walls = [s.wall_ms for s in steps if s.kind == kind]
        if walls:
            out[kind] = {
                "steps": len(walls),
                "tokens": sum(s.tokens for s in steps if s.kind == kind),
                "prompt_tokens": sum(s.prompt_tokens for s in steps if s.kind == kind),
                "wall_ms_median": statistics.median(walls),
                "wall_ms_mean": statistics.fmean(walls),
            }
    return out


# ---- the run ---------------------------------------------------------------------------


def workloads(vocab: int, requests: int | None) -> list[Workload]:
    """bench/offline.py's GPU workloads; `requests` keeps the first of them (shared_prefix:
    the first per-group requests of the first groups, 16 groups of 64 scaled down)."""
    full = gpu_workloads(None, vocab)
    if requests is None:
        return full
    tp, sp = full
    groups = max(1, min(16, round(16 * requests / 1024)))
    per = max(1, min(64, requests // groups))
    shared = [sp.prompts[g * 64 + i] for g in range(groups) for i in range(per)]
    meta = sp.meta | {"groups": groups, "per_group": per}
    return [
        Workload(
            tp.name, tp.prompts[:requests], tp.max_new_tokens, tp.meta | {"requests": requests}
        ),
        Workload(sp.name, shared, sp.max_new_tokens, meta),
    ]


def run_workload(
    engine: Engine,
    rec: StepRecorder,
    w: Workload,
    tflops: float,
    decode_steps: int,
    sampling: dict[str, float] | None = None,
) -> dict[str, Any]:
    """`sampling`: temperature / top_p for every request (default greedy)."""
    params = {"temperature": 0.0, **(sampling or {})}
    params |= {"max_new_tokens": w.max_new_tokens, "ignore_eos": True}
    engine.call(rec.take)
    _flush(engine)
    t0 = time.perf_counter()
    engine.generate(input_ids=w.prompts, sampling_params=params)
    warm_s = time.perf_counter() - t0
    warm = engine.call(rec.take)
    _flush(engine)
    window = decode_steps if w.name == "throughput" else 0
    engine.call(lambda: rec.start(window))
    t0 = time.perf_counter()
    engine.generate(input_ids=w.prompts, sampling_params=params)
    profiled_s = time.perf_counter() - t0
    engine.call(rec.stop)
    events = trace_events(rec.trace)
    ranges = windows(events)
    steps, lost = assign(rec.profiled, kernels(events), ranges)
    return {
        "workload": {**w.meta, **({"sampling": sampling} if params["temperature"] else {})},
        "warmup": {"seconds": warm_s, "steps": len(warm), "by_kind": warmup_summary(warm)},
        "profiled": {
            "seconds": profiled_s,
            "steps": len(rec.profiled),
            "step_ranges": len(ranges.get("step", [])),
            "kernels_unattributed": lost,
            "by_kind": summarize(steps, engine.worker.arch, tflops),
        },
    }


def _flush(engine: Engine) -> None:
    """Empty the radix cache once the scheduler has let go of the last run (the overlap
    scheduler may still hold its final step for a moment)."""
    for _ in range(500):
        if engine.flush_cache():
            return
        time.sleep(0.01)
    raise RuntimeError("the radix cache did not flush: requests still in flight")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """bench/offline.py's GPU options (`--kv-cache-bytes 0`: the pool sized from memory)."""
    opts: dict[str, Any] = dict(
        device=args.device,
        max_running_requests=args.max_running_requests,
        max_num_batched_tokens=args.max_num_batched_tokens,
        cuda_graph_max_batch_size=args.cuda_graph_max_batch_size,
        overlap_schedule=args.overlap_schedule,
        quantization=getattr(args, "quantization", None),
        kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"),
    )
    if args.kv_cache_bytes:
        opts["kv_cache_bytes"] = args.kv_cache_bytes
    return opts


def prefill(args: argparse.Namespace) -> dict[str, Any]:
    from torch.profiler import profile

    with profile():  # Kineto initializes on this thread, before the scheduler's starts it
        pass
    engine = Engine(args.model, **engine_options(args), gc_freeze=args.gc_freeze)
    rec = None
    try:
        rec = StepRecorder(engine)
        runs: dict[str, Any] = {
            "device": str(engine.worker.device),
            "dtype": str(engine.worker.dtype).replace("torch.", ""),
            "overlap": engine.worker.config.scheduler.overlap_schedule,
            "matmul_tflops": args.matmul_tflops,
        }
        for w in workloads(engine.worker.arch.vocab_size, args.requests):
            if w.name in args.prefill_workloads:
                sampling = {"temperature": args.temperature, "top_p": args.top_p}
                runs[w.name] = run_workload(
                    engine, rec, w, args.matmul_tflops, args.decode_steps, sampling
                )
                print_run(w.name, runs[w.name])
        return runs
    finally:
        if rec is not None:
            rec.close()
        engine.shutdown()


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192, help="prefill")
    ap.add_argument("--kv-cache-bytes", type=int, default=0, help="prefill; 0: auto-size")
    ap.add_argument("--requests", type=int, default=None, help="prefill: scale down")
    ap.add_argument("--matmul-tflops", type=float, default=793.0, help="bf16 matmul rate")
    ap.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prefill: the engine's gc_freeze (its start-up objects out of the collector)",
    )
    ap.add_argument(
        "--decode-steps",
        type=_decode_steps,
        default=64,
        help=f"prefill: throughput's decode steps profiled (1..{MAX_DECODE_STEPS})",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="prefill: every request samples at this temperature (0: greedy)",
    )
    ap.add_argument("--top-p", type=float, default=1.0, help="prefill: with --temperature > 0")
    ap.add_argument(
        "--prefill-workloads",
        nargs="+",
        choices=["throughput", "shared_prefix"],
        default=["throughput", "shared_prefix"],
    )


def _decode_steps(text: str) -> int:
    n = int(text)
    if not 1 <= n <= MAX_DECODE_STEPS:
        raise argparse.ArgumentTypeError(f"--decode-steps: 1..{MAX_DECODE_STEPS}, got {n}")
    return n


# ---- the table -------------------------------------------------------------------------


def print_run(name: str, run: dict[str, Any]) -> None:
    prof = run["profiled"]
    print(
        f"\n== {name}: {run['workload']} -- warm-up {run['warmup']['seconds']:.2f} s, "
        f"profiled {prof['seconds']:.2f} s, {prof['steps']} steps profiled, "
        f"{prof['kernels_unattributed']} kernels unattributed"
    )
    cols = ("wall", "span", "busy", "floor", *CATEGORIES)
    print(f"{'kind':<8}{'steps':>6}{'tok/step':>9}" + "".join(f"{c[:8]:>9}" for c in cols))
    for kind, k in prof["by_kind"].items():
        vals = [k["wall_ms"], k["span_ms"], k["busy_ms"], k["floor_ms"]]
        vals += [k["by_category_ms"][c] for c in CATEGORIES]
        print(
            f"{kind:<8}{k['steps']:>6}{k['tokens_per_step']:>9.0f}"
            + "".join(f"{v:>9.2f}" for v in vals)
        )
    print(f"{'kind':<8}{'':>14}{'median':>9}{'mean':>9}{'p90':>9}{'max':>9}   host shares")
    for kind, k in prof["by_kind"].items():
        shares = ", ".join(f"{p} {v:.0%}" for p, v in k["host_phase_share"].items())
        for name in ("wall_ms_dist", "idle_ms_dist"):
            d = k[name]
            print(
                f"{kind:<8}{name[:-8] + ' ms':>14}"
                + "".join(f"{d[s]:>9.2f}" for s in ("median", "mean", "p90", "max"))
                + (f"   {shares}" if name == "wall_ms_dist" else "")
            )
    for kind in ("prefill", "mixed"):
        if kind in prof["by_kind"]:
            _print_kind(kind, prof["by_kind"][kind])


def _print_kind(kind: str, k: dict[str, Any]) -> None:
    print(f"-- {kind} (ms per step unless stated); GEMMs over all {k['steps']} steps:")
    print(f"   {'M x N x K':<22}{'calls':>7}{'ms':>10}{'TFLOP/s':>9}{'of peak':>9}")
    for r in k["gemm_shapes"][:12]:
        print(
            f"   {r['mnk']:<22}{r['calls']:>7}{r['ms']:>10.2f}{r['tflops']:>9.1f}"
            f"{r['fraction_of_matmul']:>9.1%}"
        )
    a = k["attention"]
    print(
        f"   attention {a['ms']:.2f} ms, {a['tflop_prompt_rows']:.3f} + "
        f"{a['tflop_decode_rows']:.3f} TFLOP (prompt + decode rows), {a['tflops']:.1f} TFLOP/s "
        f"({a['fraction_of_matmul']:.1%})"
        + (
            f"; extend kernel {a['extend_kernel_ms']:.2f} ms, "
            f"{a['extend_kernel_tflops']:.1f} TFLOP/s"
            if "extend_kernel_ms" in a
            else ""
        )
    )
    gap = ", ".join(f"{n} {v:.2f}" for n, v in k["gap_ms"].items() if abs(v) >= 0.005)
    print(f"   floor {k['floor_ms']:.2f} of span {k['span_ms']:.2f}; gap: {gap}")
    host = ", ".join(f"{n} {v:.2f}" for n, v in k["host_phase_ms"].items())
    print(f"   host: wall {k['wall_ms']:.2f}; {host}")
