"""Where an engine step's time goes, by step kind: host phases and GPU kernels.

Three workloads:
  batch1  one request decoding --steps tokens (the TP latency figure), any --tp, with
          or without --overlap-schedule. Host phases per step from wrappers around the
          scheduler's parts, then the same run under torch.profiler: kernels per step,
          the GPU's busy time (union of kernel intervals) against the wall time, and the
          kernel time by kind (GEMM, attention, NCCL, Triton, other). With
          --draft-tokens k each step verifies k drafts that are never kept (1 + k rows,
          one token added: bench/speculative.py's verify part), so its steps are the
          verify steps whose cost the speculative target bounds.
  json    bench/json_decode.py's workload (jump-forward on, then off): each step is
          classified (graph decode, forced tokens as graphed decode rows, eager with a
          prompt chunk, other eager) and timed in its host phases (schedule, forward +
          sampling, process_output), with CUDA-event time of the model call.
  prefill bench/offline.py's GPU workloads (throughput, shared_prefix) under torch.profiler:
          per prefill / mixed / decode step, GPU span and busy time, kernels by category,
          GEMMs by M x N x K with TFLOP/s against --matmul-tflops, attention FLOPs, the
          step's floor and what takes the gap (bench/anatomy/prefill.py).

  python -m bench.step_anatomy --workload batch1 --tp 2 --overlap-schedule
  python -m bench.step_anatomy --workload batch1 --draft-tokens 4
  python -m bench.step_anatomy --workload json --documents 256
  python -m bench.step_anatomy --workload prefill [--requests 64] [--no-overlap-schedule]
Prints a table per run and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from bench import record
from bench.anatomy import prefill as prefill_workload
from bench.anatomy.kernel_trace import busy_time
from bench.anatomy.timer import PhaseTimer
from radixmesh.worker.batch import Batch
from radixmesh.worker.engine import Engine


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "p90": sorted(values)[int(0.9 * (len(values) - 1))],
    }


# ---- batch 1 ----------------------------------------------------------------------------


def _kernel_kind(name: str) -> str:
    low = name.lower()
    if "nccl" in low:
        return "nccl"
    if any(s in low for s in ("decode", "extend", "attention", "flash", "cascade")):
        return "attention"  # before "fp8": the FP8 KV decode kernels are not GEMMs
    if any(s in low for s in ("gemm", "nvjet", "xmma", "cutlass", "gemv", "sm90", "fp8")):
        return "gemm"  # FP8 weights: the small-batch kernel and the activations' quantization
    if low.startswith("triton") or ("_kernel" in low and "at::" not in low):
        return "triton"
    return "other"


def profile_generation(
    engine: Engine, prompt: list[int], params: dict[str, Any]
) -> tuple[Any, float]:
    """One generation (cache flushed first) under torch.profiler (CPU and CUDA activity):
    the profile and the wall seconds. CUPTI sees the scheduler thread's kernels, graph
    replays included."""
    from torch.profiler import ProfilerActivity, profile

    engine.flush_cache()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        engine.generate(input_ids=prompt, sampling_params=params)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    return prof, wall


def _kernel_profile(prof: Any, steps: int, wall_s: float) -> dict[str, Any]:
    """Kernel count, summed and union time per step, and time by kind."""
    intervals: list[tuple[float, float]] = []
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range is not None:
            start, end = e.time_range.start, e.time_range.end
            if end <= start:
                continue
            intervals.append((start, end))
            by_kind[_kernel_kind(e.name)] += end - start
            by_name[e.name] += end - start
    busy = busy_time(intervals)
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {
        "wall_ms_per_step": 1e3 * wall_s / steps,
        "kernels_per_step": len(intervals) / steps,
        "kernel_ms_per_step_sum": sum(e - s for s, e in intervals) / 1e3 / steps,
        "gpu_busy_ms_per_step": busy / 1e3 / steps,
        "by_kind_ms_per_step": {k: v / 1e3 / steps for k, v in by_kind.items()},
        "top_kernels_ms_per_step": [(n[:90], t / 1e3 / steps) for n, t in top],
    }


def batch1(args: argparse.Namespace) -> dict[str, Any]:
    k = args.draft_tokens
    spec: dict[str, Any] = {}
    if k:  # drafts that are never kept: each step verifies 1 + k rows and adds one token
        spec = {"speculative": "ngram", "speculative_tokens": k}
        spec["speculative_min_accept_rate"] = 0.0
    engine = Engine(
        args.model,
        tp_size=args.tp,
        overlap_schedule=args.overlap_schedule,
        max_running_requests=args.max_running_requests,
        cuda_graph_max_batch_size=args.cuda_graph_max_batch_size,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        **({"kv_cache_tokens": args.kv_cache_tokens} if args.kv_cache_tokens else {}),
        **spec,
    )
    try:
        vocab = engine.worker.arch.vocab_size
        speculator = engine.worker.scheduler.speculator
        if k:
            from bench.speculative import NeverAccepted

            assert speculator is not None
            speculator.drafter = NeverAccepted(vocab - 1)
        # Token ids below vocab - 1, which the never-kept drafts use.
        prompt = [(7 * i + 3) % (vocab - 2) + 1 for i in range(args.prompt_len)]
        params = {"max_new_tokens": args.steps, "temperature": 0.0, "ignore_eos": True}
        engine.generate(input_ids=prompt, sampling_params=params)  # warm-up
        verified = speculator.stats.verify_steps if speculator is not None else 0
        sched, runner = engine.worker.scheduler, engine.worker.runner
        timer = PhaseTimer()
        step_times: list[float] = []
        phases: list[dict[str, float]] = []
        timer.wrap(sched, "schedule", "schedule")
        timer.wrap(sched, "process_output", "process_output")
        timer.wrap(sched, "launch", "launch")
        timer.wrap(runner, "forward", "runner_forward")
        timer.wrap(runner.sampler, "draw", "sampler")
        if k:  # the draws' launch: their readback, which waits for the step, is in `launch`
            timer.wrap(runner, "_verify", "verify")
        if runner.followers is not None:
            timer.wrap(runner.followers, "send_step", "send_step")
        if runner.decode_graphs is not None:
            timer.wrap(runner.decode_graphs, "run", "graph_run")
        parts = _wrap_host_parts(timer, sched, runner)
        _time_steps(sched, timer, step_times, phases)
        engine.flush_cache()
        t0 = time.perf_counter()
        engine.generate(input_ids=prompt, sampling_params=params)
        wall = time.perf_counter() - t0
        del sched.step
        for obj, name in parts:  # the finer phases: not in the profiled runs below
            delattr(obj, name)
        body = step_times[2:-2]  # the prefill and the tail out
        names = sorted({k for p in phases for k in p})
        host = {n: statistics.fmean(p.get(n, 0.0) for p in phases[2:-2]) for n in names}
        res: dict[str, Any] = {
            "host_phase_us_median": _host_medians(phases[2:-2], body),
            "tp": args.tp,
            "overlap": engine.worker.config.scheduler.overlap_schedule,
            "steps": args.steps,
            "wall_ms_per_token": 1e3 * wall / args.steps,
            "step_ms": _summary(body),
            "host_phase_ms_mean": host,
            "draft_tokens": k,
            "verify_steps": (speculator.stats.verify_steps - verified) if speculator else 0,
        }
        if args.host_profile:
            res["host_profile"] = host_profile(engine, prompt, params, args.host_profile)
        if torch.cuda.is_available():
            prof, wall = profile_generation(engine, prompt, params)
            res["profile"] = _kernel_profile(prof, args.steps, wall)
            if args.trace:
                prof.export_chrome_trace(args.trace)
        return res
    finally:
        engine.shutdown()


def _wrap_host_parts(timer: PhaseTimer, sched: Any, runner: Any) -> list[tuple[Any, str]]:
    """Phases inside the scheduler's three (batch1): the runner's inputs (ForwardBatch,
    the table's staged writes), the attention backend's `prepare` when the step runs
    eagerly, the model's forward and the logits (on the CPU, the device's work), the
    drafts and the slots of `schedule`, and `launch`'s slot trims and drafting rows'
    readback (which waits for the step)."""
    parts: list[tuple[Any, str, str]] = [
        (runner, "_forward_batch", "inputs"),
        (runner.attn, "prepare", "attn_prepare"),
        (runner.model.model, "forward", "model"),
        (runner.model, "compute_logits", "logits"),
        (sched.slots, "alloc_decode", "alloc_decode"),
        (sched.slots, "trim", "trim"),
        (sched.slots, "free_trimmed", "free_trimmed"),
    ]
    if sched.speculator is not None:
        parts.append((sched.speculator, "drafts", "drafts"))
    for obj, name, phase in parts:
        timer.wrap(obj, name, phase)
    timed_forward = runner.forward  # runner_forward's wrapper (deleting ours drops both)

    def forward_and_readback(batch: Batch) -> Any:
        out = timed_forward(batch)
        timer.wrap(out, "read_verified", "read_verified")
        return out

    runner.forward = forward_and_readback
    wrapped = [(obj, name) for obj, name, _ in parts]
    return [*wrapped, (runner, "forward")]


def _host_medians(phases: list[dict[str, float]], step_ms: list[float]) -> dict[str, float]:
    """Per phase, the median over steps in microseconds (0 where a step lacks it), and
    `host`: a step's wall time less the model's forward and the logits, which on the CPU
    are the device's work (on a GPU they are launches, and `host` is the whole step)."""
    names = sorted({n for p in phases for n in p})
    out = {n: 1e3 * statistics.median(p.get(n, 0.0) for p in phases) for n in names}
    device = [p.get("model", 0.0) + p.get("logits", 0.0) for p in phases]
    out["host"] = 1e3 * statistics.median(s - d for s, d in zip(step_ms, device, strict=True))
    return out


def host_profile(
    engine: Engine, prompt: list[int], params: dict[str, Any], top: int
) -> dict[str, Any]:
    """One more generation with cProfile on the scheduler's steps (the thread that runs
    them): the `top` functions by own time and by cumulative time, in ms per step. Run
    apart from the timed and the kernel-profiled generations (cProfile slows every
    Python call); what it ranks is the host work on a synchronous step's critical path."""
    import cProfile
    import pstats

    sched = engine.worker.scheduler
    prof = cProfile.Profile()
    step = sched.step
    calls = [0]

    def profiled_step() -> Any:
        calls[0] += 1
        return prof.runcall(step)

    sched.step = profiled_step  # type: ignore[method-assign]
    engine.flush_cache()
    try:
        engine.generate(input_ids=prompt, sampling_params=params)
    finally:
        del sched.step
    stats = pstats.Stats(prof)
    rows: list[tuple[str, int, float, float]] = [
        (f"{Path(f).name}:{line}({fn})", nc, tt, ct)
        for (f, line, fn), (_cc, nc, tt, ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
    ]
    steps = max(calls[0], 1)

    def ranked(cumulative: bool) -> list[tuple[str, float, float]]:
        # (function, calls per step, ms per step) by own or cumulative time
        best = sorted(rows, key=lambda r: -(r[3] if cumulative else r[2]))[:top]
        return [(r[0], r[1] / steps, 1e3 * (r[3] if cumulative else r[2]) / steps) for r in best]

    return {
        "steps": steps,
        "by_own_ms_per_step": ranked(False),
        "by_cumulative_ms_per_step": ranked(True),
    }


# ---- json -------------------------------------------------------------------------------


def _step_kind(batch: Batch, graph_replayed: bool, decode_shaped: bool) -> str:
    if graph_replayed:
        return "graph_forced_rows" if decode_shaped else "graph_decode"
    if any(it.num_new_tokens > 1 and it.start < it.req.num_prompt_tokens for it in batch.items):
        return "eager_with_prompt"
    return "eager_other"


def _time_steps(
    sched: Any, timer: PhaseTimer, step_ms: list[float], phase: list[dict[str, float]]
) -> None:
    """Wrap `sched.step` (until `del sched.step`): wall time and host phases per step."""
    step = sched.step

    def timed_step() -> Any:
        t0 = time.perf_counter()
        try:
            return step()
        finally:
            step_ms.append(1e3 * (time.perf_counter() - t0))
            phase.append(timer.take())

    sched.step = timed_step


def json_steps(args: argparse.Namespace) -> dict[str, Any]:
    from bench.json_decode import SCHEMA, documents, prompts

    engine = Engine(
        args.model,
        max_running_requests=64,
        max_num_batched_tokens=2048,
        cuda_graph_max_batch_size=args.cuda_graph_max_batch_size,
        kv_cache_bytes=16_000_000_000 if torch.cuda.is_available() else 1 << 30,
    )
    try:
        params = {"temperature": 0, "max_new_tokens": 400, "json_schema": json.dumps(SCHEMA)}
        texts = prompts(engine, documents(args.documents))
        engine.generate(texts[:2], params)
        sched, runner = engine.worker.scheduler, engine.worker.runner
        graphs = runner.decode_graphs
        timer = PhaseTimer()
        timer.wrap(sched, "schedule", "schedule")
        timer.wrap(sched, "process_output", "process_output")
        records: list[dict[str, Any]] = []
        forward = runner.forward

        def timed_forward(batch: Batch) -> Any:
            replays = graphs.num_replays if graphs is not None else 0
            shaped = runner.num_decode_shaped_steps
            t0 = time.perf_counter()
            out = forward(batch)
            fwd = 1e3 * (time.perf_counter() - t0)
            replayed = graphs is not None and graphs.num_replays > replays
            kind = _step_kind(batch, replayed, runner.num_decode_shaped_steps > shaped)
            record: dict[str, Any] = {
                "kind": kind,
                "rows": len(batch.items),
                "tokens": sum(it.num_new_tokens for it in batch.items),
                "forward_ms": fwd,
            }
            records.append(record)
            draw = out.pending_draw  # constrained rows draw later: their time counts here
            if draw is not None:

                def timed_draw() -> None:
                    t1 = time.perf_counter()
                    draw()
                    record["forward_ms"] += 1e3 * (time.perf_counter() - t1)

                out.pending_draw = timed_draw
            return out

        runner.forward = timed_forward  # type: ignore[method-assign]
        runs: dict[str, Any] = {}
        for jump in (True, False):
            engine.worker.grammars.jump_forward = jump
            assert engine.flush_cache()
            records.clear()
            step_ms: list[float] = []
            phase: list[dict[str, float]] = []
            _time_steps(sched, timer, step_ms, phase)
            t0 = time.perf_counter()
            engine.generate(texts, [params] * len(texts))
            wall = time.perf_counter() - t0
            del sched.step
            kinds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
            for rec, total, ph in zip(records, step_ms, phase, strict=False):
                k = kinds[rec["kind"]]
                k["step_ms"].append(total)
                k["forward_ms"].append(rec["forward_ms"])
                k["schedule_ms"].append(ph.get("schedule", 0.0))
                k["process_ms"].append(ph.get("process_output", 0.0))
                k["rows"].append(rec["rows"])
                k["tokens"].append(rec["tokens"])
            summary = {
                name: {
                    "steps": len(v["step_ms"]),
                    "total_s": sum(v["step_ms"]) / 1e3,
                    **{f"{m}_mean": statistics.fmean(x) for m, x in v.items()},
                }
                for name, v in kinds.items()
            }
            runs["on" if jump else "off"] = {
                "seconds": wall,
                "requests_per_s": len(texts) / wall,
                "steps": len(step_ms),
                "step_seconds_sum": sum(step_ms) / 1e3,
                "by_kind": summary,
            }
        runs["ratio_on_vs_off"] = runs["on"]["requests_per_s"] / runs["off"]["requests_per_s"]
        return runs
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", choices=["batch1", "json", "prefill"], default="batch1")
    ap.add_argument("--model", default="dummy:llama-3-8b")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument(
        "--overlap-schedule",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="worker/overlap.py (default: on for CUDA)",
    )
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--documents", type=int, default=256)
    ap.add_argument("--max-running-requests", type=int, default=256)
    ap.add_argument("--cuda-graph-max-batch-size", type=int, default=256)
    ap.add_argument("--kv-cache-tokens", type=int, default=None)
    ap.add_argument("--trace", default=None, help="batch1: write a Chrome trace here")
    ap.add_argument("--quantization", default=None, help="batch1, prefill: e.g. fp8")
    ap.add_argument("--kv-cache-dtype", default="auto", help="batch1, prefill: e.g. fp8")
    ap.add_argument(
        "--draft-tokens",
        type=int,
        default=0,
        help="batch1: k drafts a step that are never kept (each step verifies 1 + k rows)",
    )
    ap.add_argument(
        "--host-profile",
        type=int,
        default=0,
        help="batch1: cProfile the scheduler's steps in one more generation, top N functions",
    )
    prefill_workload.add_arguments(ap)
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    if args.workload == "prefill":
        res = prefill_workload.prefill(args)
    else:
        res = batch1(args) if args.workload == "batch1" else json_steps(args)
        print(json.dumps(res, indent=1))
    name = f"b1-tp{args.tp}" if args.workload == "batch1" else args.workload
    if args.workload == "batch1" and args.draft_tokens:
        name = f"{name}-verify{args.draft_tokens}"
    if args.name:  # a configuration's, e.g. fp8-all
        name = f"{name}-{args.name}"
    record.write("step_anatomy", args, {"result": res}, name=name)


if __name__ == "__main__":
    main()
