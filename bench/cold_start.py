"""Cold start: the first batch after the engine starts, against the same batch run again.

The first FP8 prefill after start stalled ~1.9 s on an H200 (Triton compiles kernels at
their first launch); the worker's warm-up (`ModelConfig.warmup`, worker/warmup.py) runs
them before it is ready. This benchmark measures what a first batch still pays: for each
`--configs` precision and each `--warmup` setting, a fresh process starts an engine
(timed, the warm-up's own seconds apart), runs one batch (the peer shapes' first:
`--requests` random prompts of ISL tokens, OSL tokens each, greedy, ignore_eos), flushes
the radix cache and runs the identical batch again. `first_vs_warm` is the first run's
output tok/s over the second's (target: >= 0.9). It also records the batch sizes the
engine chose (the running cap and the largest decode graph follow the KV pool), and for
each batch where its host time went and what the process allocated meanwhile
(`host_parts`: the scheduler's parts, CUDA's and the pinned allocator's counters, garbage
collections; `HostParts`), printed first beside warm.

Each run has a process and an empty Triton cache of its own (TRITON_CACHE_DIR in a new
temporary folder): kernels an earlier process compiled to disk would hide the stall.

Each run also logs every Triton compile (worker/triton_compiles.py: Triton's own compile
hooks, nothing installed otherwise), labelled with the phase it happened in: "start"
(loading, graph capture), "warmup", "first" (the first batch) and "warm" (the batch
again), and with the step it happened in (its number in the phase and its rows, e.g.
"mixed: 600 decode rows + 2 chunks, 256 tokens"). A run's `compiles` sums them per phase
(count, seconds), `compile_log` lists them in order (kernel, specialization, seconds,
phase, step, batch); the first batch's are printed after the run's line. With the
warm-up on, "first" should be empty: whatever is there is what the warm-up misses.

`--module-loading lazy,eager` runs each configuration with CUDA_MODULE_LOADING=LAZY and
again with EAGER. CUDA loads a library's kernels at their first launch under lazy loading
(torch's default), so a first batch can pay a module load for each kernel it is the first
to run: cuBLASLt's GEMM kernels for row counts the warm-up never ran, torch's elementwise
kernels. Eager loading loads every kernel when the CUDA context is made (more memory, no
loads later). The worker asks for eager loading unless CUDA_MODULE_LOADING is set
(worker/device.py says what it measured), so `eager` (the default here) is the engine's
own start and `lazy` torch's.
Lazy runs are recorded as `<config>/warmup-<on|off>/lazy-modules` (in files written before
eager loading became the worker's default, the plain key is lazy and eager runs carry
`/eager-modules`); runs with `--overlap on|off` carry `/overlap-<on|off>` last.

`--overlap off` runs the scheduler synchronously, so a step's `launch` in `host_parts` is
the host's work alone and `process_output` holds the wait for the GPU. `--host-profile N`
runs the host parts under cProfile (slower) and ranks the N functions the first batch
spends most extra time in, by own and by cumulative time (`host_profile_gap`).

One GPU: `python -m bench.cold_start [--configs fp8-all] [--warmup on,off] [--shape
128/128] [--requests 1024] [--module-loading lazy,eager] [--overlap off]
[--host-profile 25]`; CPU smoke run: `--smoke`.
Writes bench/results/cold_start-<machine>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import itertools
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from bench import record
from bench.anatomy.timer import PhaseTimer
from bench.peer_shapes import CONFIGS, parse_shapes, run_shape
from radixmesh.worker.device import MODULE_LOADING as MODULE_LOADING_VAR
from radixmesh.worker.engine import Engine
from radixmesh.worker.triton_compiles import CompileLog, tag_steps

WARMUPS = {"on": True, "off": False}
MODULE_LOADING = ("lazy", "eager")  # CUDA_MODULE_LOADING: CUDA's default, and EAGER
PHASES = ("start", "warmup", "first", "warm")  # the compile log's (see the module doc)


def measure(
    model: str, options: dict[str, Any], isl: int, osl: int, n: int, profile: int = 0
) -> dict[str, Any]:
    """Start an engine, run the batch twice (cache flushed before each), and shut down;
    every Triton compile in the meantime logged; `profile` > 0: the host parts under
    cProfile, that many functions ranked by the first batch's extra time."""
    with CompileLog(phase="start") as log:
        return {**_measure(log, model, options, isl, osl, n, profile), **_compiles(log)}


def _measure(
    log: CompileLog, model: str, options: dict[str, Any], isl: int, osl: int, n: int, profile: int
) -> dict[str, Any]:
    t0 = time.perf_counter()
    engine = Engine(model, **options)  # the warm-up labels its own compiles
    start = time.perf_counter() - t0
    try:
        worker = engine.worker
        vocab = engine.info.vocab_size
        tag_steps(worker.scheduler)  # each compile names its step (the engine is idle)
        parts = HostParts(worker.scheduler, profile=profile > 0)
        counters: dict[str, Any] = {}
        with log.in_phase("first"), parts.phase("first", counters):
            first = run_shape(engine, isl, osl, n, vocab)
        with log.in_phase("warm"), parts.phase("warm", counters):
            warm = run_shape(engine, isl, osl, n, vocab)
        report = worker.warmup
        sc, mc = engine.config.scheduler, engine.config.model
        return {
            "start_seconds": start,
            "warmup_seconds": report.seconds if report is not None else 0.0,
            "warmup_steps": len(report.steps) if report is not None else 0,
            "first": first,
            "warm": warm,
            "first_vs_warm": first["output_tok_per_s"] / warm["output_tok_per_s"],
            "host_parts": counters,
            **({"host_profile_gap": parts.profile_gap(profile)} if profile else {}),
            "max_running_requests": sc.max_running_requests,
            "cuda_graph_max_batch_size": mc.cuda_graph_max_batch_size,
            "kv_pool_tokens": worker.allocator.num_usable_slots,
            "graph_memory_bytes": worker.graph_memory_bytes,
        }
    finally:
        engine.shutdown()


class HostParts:
    """Where a batch's time goes on the host, to set the first batch beside the warm one:
    seconds in the scheduler's three parts (`schedule`; `launch`, the forward's launch;
    `process_output`, which waits for the GPU's tokens) and its steps, then the process's
    counters over the batch: CUDA's allocator (device mallocs and frees, retries), torch's
    pinned host allocator (allocations and their microseconds, where torch reports them)
    and the garbage collector's collections per generation. A part that grows only in the
    first batch is its cost; `process_output` alone growing means the GPU took longer."""

    PARTS = ("schedule", "launch", "process_output")
    DEVICE = ("num_device_alloc", "num_device_free", "num_alloc_retries")
    HOST = ("num_host_alloc", "num_host_free", "host_alloc_time.total")

    def __init__(self, scheduler: Any, profile: bool = False) -> None:
        self.scheduler = scheduler
        self.timer = PhaseTimer()  # seconds per part, summed over the run (never taken)
        # With `profile`: cProfile over the parts, one profile per phase (`profiles`: each
        # function's (own, cumulative) seconds), to rank what the first batch adds.
        self.profile: cProfile.Profile | None = None
        self.profiles: dict[str, dict[str, tuple[float, float]]] = {}
        self._profiling = profile
        for part in self.PARTS:
            if profile:
                setattr(scheduler, part, self._profiled(getattr(scheduler, part)))
            self.timer.wrap(scheduler, part, part)

    def _profiled(self, fn: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            if self.profile is None:
                return fn(*a, **k)
            self.profile.enable()
            try:
                return fn(*a, **k)
            finally:
                self.profile.disable()

        return call

    def counters(self) -> dict[str, float]:
        out: dict[str, float] = {part: self.timer.current[part] for part in self.PARTS}
        out["steps"] = self.scheduler.stats().num_steps
        for gen, st in enumerate(gc.get_stats()):
            out[f"gc_gen{gen}"] = st["collections"]
        if torch.cuda.is_available():
            dev = torch.cuda.memory_stats()
            out.update({k: dev[k] for k in self.DEVICE if k in dev})
            host: dict[str, Any] = getattr(torch.cuda, "host_memory_stats", dict)()
            out.update({k: host[k] for k in self.HOST if k in host})
        return out

    @contextlib.contextmanager
    def phase(self, name: str, into: dict[str, Any]) -> Iterator[None]:
        """`into[name]`: each counter's change over the block."""
        before = self.counters()
        self.profile = cProfile.Profile() if self._profiling else None
        yield
        after = self.counters()
        into[name] = {k: after[k] - before.get(k, 0) for k in after}
        if self.profile is not None:
            stats = pstats.Stats(self.profile).stats  # type: ignore[attr-defined]
            self.profiles[name] = {
                f"{Path(f).name}:{line}({fn})": (tt, ct)
                for (f, line, fn), (_cc, _nc, tt, ct, _callers) in stats.items()
            }
            self.profile = None

    def profile_gap(self, top: int) -> dict[str, list[tuple[str, float, float]]]:
        """The `top` functions by how much more time the first batch spent in them than the
        warm one, by own and by cumulative time: (function, first ms, warm ms)."""
        first, warm = self.profiles["first"], self.profiles["warm"]
        none = (0.0, 0.0)

        def ranked(i: int) -> list[tuple[str, float, float]]:
            gap = sorted(first, key=lambda f: warm.get(f, none)[i] - first[f][i])[:top]
            return [(f, 1e3 * first[f][i], 1e3 * warm.get(f, none)[i]) for f in gap]

        return {"by_own": ranked(0), "by_cumulative": ranked(1)}


def _compiles(log: CompileLog) -> dict[str, Any]:
    """The log's per-phase sums, every phase named, and its compiles in order."""
    summary = log.summary()
    return {
        "compiles": {
            phase: summary.get(phase, {"compiles": 0, "seconds": 0.0}) for phase in PHASES
        },
        "compile_log": log.records(),
    }


def run_in_own_process(
    args: argparse.Namespace, config: str, warmup: str, modules: str = "eager"
) -> dict[str, Any]:
    """`measure` in a child process with an empty Triton cache and CUDA_MODULE_LOADING
    `modules` (upper-cased); its figures."""
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        out = Path(tmp) / "run.json"
        env = {**os.environ, "TRITON_CACHE_DIR": str(Path(tmp) / "triton")}
        env[MODULE_LOADING_VAR] = modules.upper()
        cmd = [sys.executable, "-m", "bench.cold_start", "--child", f"{config}:{warmup}"]
        cmd += ["--child-out", str(out), "--model", args.model, "--shape", args.shape]
        cmd += ["--requests", str(args.requests), "--overlap", args.overlap]
        cmd += ["--host-profile", str(args.host_profile)]
        subprocess.run(cmd, env=env, check=True)
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def child(args: argparse.Namespace) -> None:
    config, _, warmup = args.child.partition(":")
    quantization, kv_dtype = CONFIGS[config]
    options = {"quantization": quantization, "kv_cache_dtype": kv_dtype, "warmup": WARMUPS[warmup]}
    if args.overlap != "auto":
        options["overlap_schedule"] = args.overlap == "on"
    [(isl, osl)] = parse_shapes(args.shape)
    result = measure(args.model, options, isl, osl, args.requests, args.host_profile)
    result["cuda_module_loading"] = os.environ.get(MODULE_LOADING_VAR, "")
    Path(args.child_out).write_text(json.dumps(result))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="dummy:llama-3-8b")
    ap.add_argument("--configs", default="fp8-all", help=f"of {sorted(CONFIGS)}")
    ap.add_argument("--warmup", default="on,off", help="on, off or both")
    ap.add_argument("--shape", default="128/128", help="ISL/OSL of the batch")
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument(
        "--host-profile",
        type=int,
        default=0,
        help="N > 0: the host parts under cProfile (slower), the N functions the first batch "
        "spends most extra time in (host_profile_gap)",
    )
    ap.add_argument(
        "--overlap",
        choices=("auto", "on", "off"),
        default="auto",
        help="the overlap scheduler (auto: the device's default); off: each step's launch "
        "is the host's alone and process_output holds the wait for the GPU (host_parts)",
    )
    ap.add_argument(
        "--module-loading",
        default="eager",
        help="eager (the worker's default), lazy or both: CUDA_MODULE_LOADING (module doc)",
    )
    ap.add_argument("--smoke", action="store_true", help="CPU: dummy:tiny, a tiny batch")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args)
    else:
        parent(args)


def parent(args: argparse.Namespace) -> None:
    if args.smoke:
        args.model, args.shape, args.requests = "dummy:tiny", "16/4", 4
    modules = args.module_loading.split(",")
    if not set(modules) <= set(MODULE_LOADING):
        raise ValueError(f"--module-loading: {args.module_loading!r} is not lazy, eager or both")
    for config in args.configs.split(","):
        if config not in CONFIGS:
            raise ValueError(f"--configs: unknown {config!r}; choices: {sorted(CONFIGS)}")
    for warmup in args.warmup.split(","):
        if warmup not in WARMUPS:
            raise ValueError(f"--warmup: {warmup!r} is not on or off")
    runs: dict[str, Any] = {}
    for config, warmup, loading in itertools.product(
        args.configs.split(","), args.warmup.split(","), modules
    ):
        key = f"{config}/warmup-{warmup}" + ("/lazy-modules" if loading == "lazy" else "")
        key += f"/overlap-{args.overlap}" if args.overlap != "auto" else ""
        r = runs[key] = run_in_own_process(args, config, warmup, loading)
        label = f"{config:8} warm-up {warmup:3}" + (" lazy modules" if loading == "lazy" else "")
        print(
            f"{label}: start {r['start_seconds']:.1f} s (warm-up "
            f"{r['warmup_seconds']:.1f} s), first {r['first']['output_tok_per_s']:,.0f} "
            f"tok/s, warm {r['warm']['output_tok_per_s']:,.0f}: {r['first_vs_warm']:.2f}x",
            flush=True,
        )
        # the first batch's compiles where the warm-up should have left none
        print(compiles_report(r, detail=WARMUPS[warmup]), flush=True)
        print(host_parts_report(r), flush=True)
        for by, rows in r.get("host_profile_gap", {}).items():
            print(f"  first batch's extra host time {by.replace('_', ' ')} (ms, first / warm):")
            for fn, a, b in rows:
                print(f"    {a:9.1f} / {b:9.1f}  {fn}")
    record.write("cold_start", args, {"model": args.model, "runs": runs})


def host_parts_report(run: dict[str, Any]) -> str:
    """The first batch's host parts and counters beside the warm batch's, one per line."""
    first, warm = run["host_parts"]["first"], run["host_parts"]["warm"]
    lines = ["  host parts and counters (first / warm):"]
    for key in first:
        a, b = first[key], warm.get(key, 0)
        lines.append(
            f"    {key:24} {a * 1e3:10.1f} / {b * 1e3:10.1f} ms"
            if key in HostParts.PARTS
            else f"    {key:24} {a:10g} / {b:10g}"
        )
    return "\n".join(lines)


def compiles_report(run: dict[str, Any], detail: bool, limit: int = 12) -> str:
    """Lines for a run's log: compiles and seconds per phase; with `detail`, the first
    batch's compiles too (the `limit` longest, each with its step; all in the JSON)."""
    sums = ", ".join(
        f"{phase} {s['compiles']} ({s['seconds']:.1f} s)" for phase, s in run["compiles"].items()
    )
    lines = [f"  Triton compiles: {sums}"]
    first = [c for c in run["compile_log"] if c["phase"] == "first"] if detail else []
    for c in sorted(first, key=lambda c: -c["seconds"])[:limit]:
        where = f"step {c['step']}: {c['batch']}" if c["step"] is not None else "before a step"
        signature = c["signature"] if len(c["signature"]) <= 160 else c["signature"][:157] + "..."
        lines.append(f"    {c['seconds']:5.2f} s {c['kernel']} ({where}) [{signature}]")
    if len(first) > limit:
        lines.append(f"    ... {len(first) - limit} more in compile_log")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
