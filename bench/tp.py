"""Tensor parallelism: one worker at tp 1 and tp 2 (or any --tp list), side by side.

For each TP size, in its own child process (so each run starts with every GPU empty):
  throughput      N x (512 in, 256 out), greedy, ignore_eos (bench/offline.py's GPU
                  workload; --requests N takes the first N of its 256)
  shared_prefix   G groups x 64 requests sharing a 1,536-token prefix, 64 own, 8 out
                  (offline.py's; --groups G takes the first G of its 16)
  decode_batch1   per-token latency of one request (512-token prompt): the wall time of
                  max_new_tokens = 1 + K minus that of 1 (prefill cancels), over K tokens
and, for each TP size > 1, a standalone all-reduce of [batch, hidden] in the model dtype
over the same group shape (a loop of --allreduce-iters, after warm-up), per call, and per
decode step (2 per layer + 1 for the embedding; the LM head's all-gather not counted).

With --configs, each TP size runs once per precision: bf16 (the model dtype), fp8 (FP8
weights), fp8-kv (FP8 KV cache), fp8-all (both); runs are named tp1, tp1-fp8, ..., and
each FP8 run is compared with the same TP size's bf16 run (throughput, shared prefix,
batch-1 time per token, KV pool tokens).

GPU run (two H200s):
  python -m bench.tp                       # dummy:llama-3-8b, tp 1 and 2, full sizes
  python -m bench.tp --tp 1 --configs bf16,fp8,fp8-kv,fp8-all   # FP8 side by side
  python -m bench.tp --model dummy:llama-3-70b --layers 20 --tp 2   # only if it fits
CPU smoke check (gloo, seconds):
  python -m bench.tp --smoke               # dummy:tiny, 8 requests, small sizes
Writes bench/results/tp-<machine>.json (or --out) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from bench import record
from bench.offline import Workload, gpu_workloads, run_engine
from bench.step_anatomy import profile_generation
from radixmesh.worker.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
# --configs: precision name -> (--quantization, --kv-cache-dtype) of its runs.
CONFIGS = {
    "bf16": ("none", "auto"),
    "fp8": ("fp8", "auto"),
    "fp8-kv": ("none", "fp8"),
    "fp8-all": ("fp8", "fp8"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="dummy:llama-3-8b")
    ap.add_argument("--layers", type=int, default=None, help="override a dummy preset's depth")
    ap.add_argument("--tp", default="1,2", help="comma-separated TP sizes")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--requests", type=int, default=256, help="throughput requests (<= 256)")
    ap.add_argument("--groups", type=int, default=16, help="shared-prefix groups (<= 16)")
    ap.add_argument("--per-group", type=int, default=64, help="requests per group (<= 64)")
    ap.add_argument("--output-len", type=int, default=256, help="throughput new tokens")
    ap.add_argument("--decode-tokens", type=int, default=128, help="K of decode_batch1")
    ap.add_argument("--max-running-requests", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--kv-cache-tokens", type=int, default=None, help="default: auto (GPU)")
    ap.add_argument("--cuda-graph-max-batch-size", type=int, default=256)
    ap.add_argument("--allreduce-iters", type=int, default=200)
    ap.add_argument("--allreduce-batches", default="1,64,256")
    ap.add_argument(
        "--profile-steps", type=int, default=64, help="CUDA: profile K batch-1 decode steps"
    )
    ap.add_argument("--smoke", action="store_true", help="CPU: dummy:tiny, small sizes")
    ap.add_argument(
        "--overlap-schedule",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="worker/overlap.py (default: on for CUDA)",
    )
    ap.add_argument(
        "--configs", default="bf16", help=f"comma-separated precisions: {', '.join(CONFIGS)}"
    )
    ap.add_argument("--quantization", default="none", choices=["none", "fp8"])
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    record.add_output_arguments(ap)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal
    args = ap.parse_args(argv)
    unknown = [c for c in args.configs.split(",") if c not in CONFIGS]
    if unknown:
        ap.error(f"--configs: unknown {unknown}; choices: {', '.join(CONFIGS)}")
    if args.smoke:
        args.model, args.requests, args.groups, args.per_group = "dummy:tiny", 8, 1, 8
        args.output_len, args.decode_tokens, args.allreduce_iters = 16, 16, 20
        args.max_running_requests, args.max_num_batched_tokens = 16, 2048
        args.kv_cache_tokens = args.kv_cache_tokens or 16384
        args.cuda_graph_max_batch_size = 16
    return args


def engine_options(args: argparse.Namespace, tp: int) -> dict[str, Any]:
    opts: dict[str, Any] = dict(
        device=args.device,
        dtype=args.dtype,
        tp_size=tp,
        max_running_requests=args.max_running_requests,
        max_num_batched_tokens=args.max_num_batched_tokens,
        cuda_graph_max_batch_size=args.cuda_graph_max_batch_size,
        overlap_schedule=args.overlap_schedule,
        quantization=None if args.quantization == "none" else args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    if args.kv_cache_tokens is not None:
        opts["kv_cache_tokens"] = args.kv_cache_tokens
    return opts


def model_spec(args: argparse.Namespace) -> str:
    return f"{args.model}@layers={args.layers}" if args.layers else args.model


def workloads(args: argparse.Namespace, engine: Engine) -> list[Workload]:
    throughput, shared = gpu_workloads(engine.tokenizer, engine.worker.arch.vocab_size)
    per, groups = args.per_group, args.groups
    shared_prompts = [p for g in range(groups) for p in shared.prompts[g * 64 : g * 64 + per]]
    return [
        Workload(
            "throughput",
            throughput.prompts[: args.requests],
            args.output_len,
            {"requests": args.requests, "input": 512, "new_tokens": args.output_len},
        ),
        Workload(
            "shared_prefix",
            shared_prompts,
            shared.max_new_tokens,
            {**shared.meta, "groups": groups, "per_group": per},
        ),
    ]


def decode_latency(engine: Engine, prompt: list[int], k: int) -> dict[str, Any]:
    """ms per decoded token at batch 1: (T(1 + k new) - T(1 new)) / k, best of 3 each."""

    def timed(n: int) -> float:
        best = float("inf")
        for _ in range(3):
            engine.flush_cache()  # the same prefill every time
            t0 = time.perf_counter()
            engine.generate(
                input_ids=prompt,
                sampling_params={"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True},
            )
            best = min(best, time.perf_counter() - t0)
        return best

    one, many = timed(1), timed(1 + k)
    return {
        "prompt_tokens": len(prompt),
        "decode_tokens": k,
        "seconds_1": one,
        "seconds_1_plus_k": many,
        "ms_per_token": (many - one) / k * 1e3,
    }


def profile_decode(engine: Engine, prompt: list[int], steps: int) -> dict[str, Any]:
    """GPU time in NCCL kernels per batch-1 decode step, from torch.profiler
    (`step_anatomy.profile_generation`; its `--workload batch1` breaks down the rest)."""
    params = {"max_new_tokens": steps, "temperature": 0.0, "ignore_eos": True}
    prof, wall = profile_generation(engine, prompt, params)

    def device_us(e: Any) -> float:
        return float(getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0))

    events = prof.key_averages()
    nccl = sum(device_us(e) for e in events if "nccl" in e.key.lower())
    kernels = sum(device_us(e) for e in events if e.key.startswith(("void ", "nccl", "triton")))
    return {
        "steps": steps,
        "wall_ms_per_step": wall / steps * 1e3,
        "nccl_kernel_ms_per_step": nccl / steps / 1e3,
        "kernel_ms_per_step_approx": kernels / steps / 1e3,
        "top_nccl": [(e.key, device_us(e)) for e in events if "nccl" in e.key.lower()][:5],
    }


def run_child(args: argparse.Namespace, tp: int, out: Path) -> None:
    """One TP size: build the engine, run the workloads, write JSON to `out`."""
    t0 = time.perf_counter()
    engine = Engine(model_spec(args), **engine_options(args, tp))
    load_s = time.perf_counter() - t0
    try:
        ws = workloads(args, engine)
        engine.generate(
            input_ids=ws[0].prompts[:2], sampling_params={"max_new_tokens": 4, "temperature": 0}
        )  # warm-up
        res: dict[str, Any] = {"tp": tp, "load_seconds": load_s}
        res["decode_batch1"] = decode_latency(engine, ws[0].prompts[0], args.decode_tokens)
        for w in ws:
            engine.flush_cache()
            res[w.name] = {"workload": w.meta, **run_engine(engine, w)}
        if args.profile_steps and engine.worker.device.type == "cuda":
            try:
                res["profile_batch1"] = profile_decode(engine, ws[0].prompts[0], args.profile_steps)
            except Exception as e:  # the figures above stand without it
                res["profile_batch1"] = {"error": f"{type(e).__name__}: {e}"}
        worker = engine.worker
        res["kv_pool_slots"] = worker.kv_pool.num_slots
        res["kv_heads_per_rank"] = worker.kv_pool.num_kv_heads
        res["kv_cache_dtype"] = str(worker.kv_pool.dtype).replace("torch.", "")
        res["quantization"] = worker.quantization
        res["dtype"] = str(worker.dtype).replace("torch.", "")
        res["device"] = str(worker.device)
        res["overlap_schedule"] = worker.config.scheduler.overlap_schedule
        res["cuda_graphs"] = worker.runner.decode_graphs is not None
        arch = worker.arch
        res["arch"] = {
            "hidden_size": arch.hidden_size,
            "layers": arch.num_hidden_layers,
            "heads": arch.num_attention_heads,
            "kv_heads": arch.num_key_value_heads,
            "params": arch.num_params,
        }
        out.write_text(json.dumps(res))  # before shutdown: a teardown hang loses nothing
    finally:
        engine.shutdown()


# ---- standalone all-reduce ------------------------------------------------------------------


def _allreduce_rank(
    rank: int, world: int, port: int, device_type: str, dtype: str, args: dict[str, Any], q: Any
) -> None:
    import torch.distributed as dist

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0)
    dist.init_process_group(
        "nccl" if device_type == "cuda" else "gloo",
        store=store,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    out: dict[str, Any] = {}
    for batch in args["batches"]:
        x = torch.ones(batch, args["hidden"], dtype=getattr(torch, dtype), device=device)
        for _ in range(10):
            dist.all_reduce(x)
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args["iters"]):
            dist.all_reduce(x)
        _sync(device)
        per_call = (time.perf_counter() - t0) / args["iters"]
        out[str(batch)] = {
            "us_per_call": per_call * 1e6,
            "bytes": x.numel() * x.element_size(),
            "per_decode_step_ms": per_call * (2 * args["layers"] + 1) * 1e3,
        }
    if rank == 0:
        q.put(out)
    dist.destroy_process_group()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allreduce_times(args: argparse.Namespace, world: int, arch: dict[str, Any], dtype: str) -> Any:
    import torch.multiprocessing as mp

    from radixmesh.cluster.launch import free_port

    device_type = "cpu" if args.device == "cpu" or not torch.cuda.is_available() else "cuda"
    params = {
        "batches": [int(b) for b in args.allreduce_batches.split(",")],
        "hidden": arch["hidden_size"],
        "layers": arch["layers"],
        "iters": args.allreduce_iters,
    }
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=_allreduce_rank, args=(r, world, port, device_type, dtype, params, q))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    if any(p.exitcode != 0 for p in procs):
        return {"error": f"exit codes {[p.exitcode for p in procs]}"}
    return {"device": device_type, "dtype": dtype, "hidden": params["hidden"], **q.get()}


# ---- driver ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child is not None:
        code = 0
        try:
            run_child(args, int(args.child.split(":")[0]), Path(args.child.split(":", 1)[1]))
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # an NCCL group's teardown must not block the parent
    sizes = [int(t) for t in args.tp.split(",")]
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for tp, config in [(tp, c) for tp in sizes for c in args.configs.split(",")]:
            name = f"tp{tp}" if config == "bf16" else f"tp{tp}-{config}"
            out = Path(tmp) / f"{name}.json"
            quant, kv = CONFIGS[config]
            cmd = [sys.executable, "-m", "bench.tp", *argv, "--child", f"{tp}:{out}"]
            if len(args.configs.split(",")) > 1 or config != "bf16":
                cmd += ["--quantization", quant, "--kv-cache-dtype", kv]
            print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
            rc = subprocess.run(cmd, cwd=ROOT).returncode
            if rc != 0 and args.cuda_graph_max_batch_size > 0 and torch.cuda.is_available():
                # Keep the figures if only graph capture failed; the JSON says so.
                print(f"== tp {tp} failed (rc {rc}): again without CUDA graphs", flush=True)
                cmd += ["--cuda-graph-max-batch-size", "0"]
                if subprocess.run(cmd, cwd=ROOT).returncode == 0:
                    note = {"note": f"first run failed (rc {rc}); this one has no CUDA graphs"}
                    rc = 0
                    out.write_text(json.dumps({**json.loads(out.read_text()), **note}))
            runs[name] = json.loads(out.read_text()) if rc == 0 else {"error": f"rc {rc}"}
    ok = [r for r in runs.values() if "error" not in r]
    allreduce: dict[str, Any] = {}
    if ok:
        for tp in sizes:
            if tp > 1:
                allreduce[f"tp{tp}"] = allreduce_times(args, tp, ok[0]["arch"], ok[0]["dtype"])
    report = {
        "model": model_spec(args),
        "note": f"dummy preset with --layers {args.layers}" if args.layers else "",
        "runs": runs,
        "allreduce": allreduce,
        "ratios": _ratios(runs),
    }
    _print_table(runs, allreduce)
    label = "smoke" if args.smoke else (f"layers{args.layers}" if args.layers else None)
    record.write("tp", args, report, name=label)


def _ratios(runs: dict[str, Any]) -> dict[str, float]:
    """Each tp > 1 against tp 1: latency ratio (target <= 0.65 at tp 2) and speedups; each
    FP8 run against its TP size's bf16 run (see `_precision_ratios`)."""
    out = _precision_ratios(runs)
    base = runs.get("tp1")
    if not base or "error" in base:
        return out
    for name, r in runs.items():
        if name == "tp1" or "-" in name or "error" in r:
            continue
        out[f"{name}_decode_latency_vs_tp1"] = (
            r["decode_batch1"]["ms_per_token"] / base["decode_batch1"]["ms_per_token"]
        )
        out[f"{name}_throughput_vs_tp1"] = (
            r["throughput"]["output_tok_per_s"] / base["throughput"]["output_tok_per_s"]
        )
        out[f"{name}_shared_prefix_vs_tp1"] = (
            r["shared_prefix"]["req_per_s"] / base["shared_prefix"]["req_per_s"]
        )
    return out


def _precision_ratios(runs: dict[str, Any]) -> dict[str, float]:
    """tpN-<config> against tpN: throughput and shared prefix (FP8 weights' target: >= 1.5x
    bf16), batch-1 time per token (<= 0.6x) and KV pool tokens (FP8 KV: >= 1.9x)."""
    out: dict[str, float] = {}
    for name, r in runs.items():
        base = runs.get(name.split("-", 1)[0])
        if "-" not in name or "error" in r or not base or "error" in base:
            continue
        out[f"{name}_throughput_vs_bf16"] = (
            r["throughput"]["output_tok_per_s"] / base["throughput"]["output_tok_per_s"]
        )
        out[f"{name}_shared_prefix_vs_bf16"] = (
            r["shared_prefix"]["req_per_s"] / base["shared_prefix"]["req_per_s"]
        )
        out[f"{name}_decode_latency_vs_bf16"] = (
            r["decode_batch1"]["ms_per_token"] / base["decode_batch1"]["ms_per_token"]
        )
        out[f"{name}_kv_pool_slots_vs_bf16"] = r["kv_pool_slots"] / base["kv_pool_slots"]
    return out


def _print_table(runs: dict[str, Any], allreduce: dict[str, Any]) -> None:
    print(
        f"{'run':12} {'load s':>8} {'tok/s':>10} {'shared req/s':>13} {'ms/token b1':>12} "
        f"{'KV slots':>10}"
    )
    for name, r in runs.items():
        if "error" in r:
            print(f"{name:12} {r['error']}")
            continue
        print(
            f"{name:12} {r['load_seconds']:8.1f} {r['throughput']['output_tok_per_s']:10.1f} "
            f"{r['shared_prefix']['req_per_s']:13.2f} {r['decode_batch1']['ms_per_token']:12.3f} "
            f"{r['kv_pool_slots']:10d}"
        )
    for name, a in allreduce.items():
        if "error" in a:
            print(f"all-reduce {name}: {a['error']}")
            continue
        for b, v in a.items():
            if isinstance(v, dict):
                print(
                    f"all-reduce {name} batch {b}: {v['us_per_call']:.1f} us/call, "
                    f"{v['per_decode_step_ms']:.3f} ms per decode step"
                )


if __name__ == "__main__":
    main()
