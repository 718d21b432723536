"""Offline throughput: radixmesh's engine vs Hugging Face transformers, side by side.

Workloads (the CPU set, bundled SmolLM2-135M-Instruct):
  throughput     32 requests x 128 new tokens (greedy, ignore_eos), varied chat prompts
  shared_prefix  4 groups x 8 requests sharing a 512-token prefix, 16 new tokens each,
                 with the radix cache on and off
The baseline is `model.generate` on one left-padded batch of the same prompts (its best
case on CPU: one batched call). Both run greedy in float32 on the same weights.

Prints a table and writes JSON to bench/results/ (machine, date, versions, figures).
Run: `.venv/bin/python -m bench.offline [--model smollm2] [--skip-baseline]`.
The same script drives GPU runs: `--model dummy:llama-3-8b --device cuda --workloads gpu`.
FP8: `--quantization fp8` (weights) and `--kv-cache-dtype fp8` (KV pool); a run per
configuration, e.g. `--name bf16` then `--quantization fp8 --kv-cache-dtype fp8 --name fp8
--skip-baseline`, and compare the two JSONs (throughput, kv_pool_tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import random
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from bench import record
from radixmesh.worker.engine import Engine

QUESTIONS = [
    "Explain how a bicycle stays upright.",
    "Write a haiku about autumn rain.",
    "What causes the seasons on Earth?",
    "Give three tips for learning a language.",
    "Describe the water cycle.",
    "Why is the sky blue?",
    "How do vaccines work?",
    "Summarize the plot of Romeo and Juliet.",
    "What is a prime number?",
    "List four renewable energy sources.",
    "How does a refrigerator keep food cold?",
    "What is photosynthesis?",
    "Explain gravity to a child.",
    "Why do cats purr?",
    "How are rainbows formed?",
    "What does a compiler do?",
    "Describe a healthy breakfast.",
    "What is the speed of light?",
    "Why do leaves change color?",
    "How do bees make honey?",
    "What is machine learning?",
    "Describe the Eiffel Tower.",
    "How do airplanes fly?",
    "What is inflation in economics?",
    "Write a short poem about the sea.",
    "How does the heart pump blood?",
    "What is a black hole?",
    "Name five musical instruments.",
    "Explain what DNA is.",
    "How do volcanoes erupt?",
    "What are the phases of the Moon?",
    "Why is exercise important?",
]

PASSAGES = [
    "The history of cartography is the story of people trying to picture the world. ",
    "Modern compilers translate source code through many intermediate representations. ",
    "Coral reefs are built by colonies of tiny animals that secrete calcium carbonate. ",
    "The industrial revolution changed how goods were made, moved and sold worldwide. ",
]


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    max_new_tokens: int
    meta: dict[str, Any] = field(default_factory=dict)


def cpu_workloads(tok: Any, vocab: int) -> list[Workload]:
    chat = [tok.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS[:32]]
    shared: list[list[int]] = []
    for g, passage in enumerate(PASSAGES):
        prefix = (tok.encode(passage) * 200)[:512]
        for i in range(8):
            shared.append(prefix + tok.encode(f" Question {g}.{i}: {QUESTIONS[g * 8 + i]}"))
    return [
        Workload("throughput", chat, 128, {"requests": 32, "new_tokens": 128}),
        Workload(
            "shared_prefix",
            shared,
            16,
            {"groups": 4, "per_group": 8, "prefix_tokens": 512, "new_tokens": 16},
        ),
    ]


def gpu_workloads(tok: Any, vocab: int) -> list[Workload]:
    rng = random.Random(0)
    rand = [[rng.randrange(256, vocab) for _ in range(512)] for _ in range(256)]
    shared: list[list[int]] = []
    for _ in range(16):
        prefix = [rng.randrange(256, vocab) for _ in range(1536)]
        shared += [prefix + [rng.randrange(256, vocab) for _ in range(64)] for _ in range(64)]
    return [
        Workload("throughput", rand, 256, {"requests": 256, "input": 512, "new_tokens": 256}),
        Workload(
            "shared_prefix",
            shared,
            8,
            {"groups": 16, "per_group": 64, "prefix_tokens": 1536, "own": 64, "new_tokens": 8},
        ),
    ]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_engine(
    engine: Engine, w: Workload, sampling: dict[str, float] | None = None
) -> dict[str, Any]:
    """`sampling`: temperature / top_p for every request (default greedy)."""
    params = {"temperature": 0.0, **(sampling or {})}
    params |= {"max_new_tokens": w.max_new_tokens, "ignore_eos": True}
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=w.prompts, sampling_params=params)
    dt = time.perf_counter() - t0
    assert isinstance(outs, list)
    out_tokens = sum(len(o["output_ids"]) for o in outs)
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    return {
        "seconds": dt,
        "output_tokens": out_tokens,
        "output_tok_per_s": out_tokens / dt,
        "req_per_s": len(w.prompts) / dt,
        "cached_tokens": cached,
        "prompt_tokens": sum(len(p) for p in w.prompts),
    }


def run_engine_repeated(
    engine: Engine, w: Workload, repeats: int, sampling: dict[str, float] | None = None
) -> dict[str, Any]:
    """`run_engine` `repeats` times (cache flushed before each); the figures are the
    median run's, and every run's seconds are kept (run-to-run spread)."""
    runs = []
    for _ in range(repeats):
        engine.flush_cache()
        runs.append(run_engine(engine, w, sampling))
    median = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    return {**median, "runs_seconds": [r["seconds"] for r in runs]}


def run_hf(model: Any, w: Workload, pad_id: int, device: str) -> dict[str, Any]:
    width = max(len(p) for p in w.prompts)
    ids = torch.full((len(w.prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(w.prompts):  # left padding, as generate expects
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=False,
            max_new_tokens=w.max_new_tokens,
            min_new_tokens=w.max_new_tokens,
            pad_token_id=pad_id,
        )
    dt = time.perf_counter() - t0
    out_tokens = int((out.shape[1] - width) * out.shape[0])
    return {
        "seconds": dt,
        "output_tokens": out_tokens,
        "output_tok_per_s": out_tokens / dt,
        "req_per_s": len(w.prompts) / dt,
    }


def run_hf_continuous(model: Any, w: Workload, block_sharing: bool) -> dict[str, Any]:
    """transformers' own continuous batching (`generate_batch`: paged KV, CUDA graphs), the
    GPU baseline. `seconds` spans the requests' lifetimes (its per-call set-up and graph
    warm-up excluded, as our engine's start-up is); `call_seconds` is the whole call."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    gen = GenerationConfig(max_new_tokens=w.max_new_tokens, do_sample=False)
    cb = ContinuousBatchingConfig(allow_block_sharing=block_sharing)
    t0 = time.perf_counter()
    outs = model.generate_batch(
        inputs=w.prompts, generation_config=gen, continuous_batching_config=cb
    )
    call = time.perf_counter() - t0
    done = list(outs.values())
    errors = [o.error for o in done if o.error]
    start = min(o.created_time for o in done)
    dt = max(o.lifespan[1] for o in done) - start
    out_tokens = sum(len(o.generated_tokens) for o in done)
    return {
        "seconds": dt,
        "call_seconds": call,
        "output_tokens": out_tokens,
        "output_tok_per_s": out_tokens / dt,
        "req_per_s": len(w.prompts) / dt,
        "api": "generate_batch",
        "block_sharing": block_sharing,
        "errors": errors[:3],
    }


def dummy_hf_model(preset: str, device: str, dtype: torch.dtype, seed: int = 0) -> Any:
    """transformers' LlamaForCausalLM holding the engine's dummy weights (same preset and
    seed). eos_token_id stays None, so generation never stops early (like ignore_eos)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from radixmesh.worker.model import dummy

    arch = dummy.preset_arch(preset)
    config = LlamaConfig(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_size,
        rms_norm_eps=arch.rms_norm_eps,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": arch.rope_theta,
            **(arch.rope_scaling or {}),
        },
        eos_token_id=None,
    )
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    weights = dict(dummy.iter_dummy_weights(arch, dtype=dtype, device=device, seed=seed))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if arch.tie_word_embeddings else set()
    assert not unexpected and set(missing) <= tied, (missing, unexpected)
    return model.eval()


def load_hf_model(spec: str, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    from radixmesh.worker.model.loader import resolve_model

    src = resolve_model(spec)
    if src.kind == "dummy":
        return dummy_hf_model(src.preset or "", device, dtype)
    if src.kind == "gguf":  # the gguf package is only needed here (the GPU machine lacks it)
        from radixmesh.worker.model.gguf import ensure_converted

        path = str(ensure_converted(src.path or ""))
    elif src.kind == "hf":
        path = src.path or ""
    else:
        raise SystemExit("the transformers baseline needs real weights (gguf or hf directory)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    # transformers declares `.to` through functools.wraps(nn.Module.to), so its stub takes
    # the device for `self`: a defect of that stub, not of this call.
    return model.to(device).eval()  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--workloads", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument(
        "--kv-cache-bytes", type=int, default=1 << 30, help="0: auto-size the pool on CUDA"
    )
    ap.add_argument("--mem-fraction", type=float, default=0.9, help="with --kv-cache-bytes 0")
    # The CPU workloads' sizes by default; 0 (-1 for the graphs) leaves a size to the
    # engine, which on CUDA sizes the running cap and the graphs from the KV pool.
    ap.add_argument("--max-running-requests", type=int, default=64, help="0: the engine's default")
    ap.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="0: the engine's default"
    )
    ap.add_argument(
        "--cuda-graph-max-batch-size",
        type=int,
        default=256,
        help="0: no graphs; -1: the engine's default",
    )
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument(
        "--skip-cache-off",
        action="store_true",
        help="no radix-cache-off engine (its shared-prefix run takes ~40 s on an H200)",
    )
    ap.add_argument(
        "--overlap-schedule",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="worker/overlap.py (default: on for CUDA)",
    )
    ap.add_argument("--quantization", default=None, choices=["fp8"], help="FP8 linear weights")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    ap.add_argument("--attention-backend", default="auto", help="auto, triton, flashinfer or torch")
    ap.add_argument(
        "--deterministic", action="store_true", help="batch-invariant engine (docs/determinism.md)"
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the throughput workload this many times on the cache-on and cache-off "
        "engines and report the median (the cache-overhead ratio needs the spread)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="our engine's requests sample at this temperature (0: greedy); the "
        "transformers baseline stays greedy, so pair it with --skip-baseline",
    )
    ap.add_argument("--top-p", type=float, default=1.0, help="with --temperature > 0")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    sampling = {"temperature": args.temperature, "top_p": args.top_p}

    common = dict(
        device=args.device,
        dtype=args.dtype,
        kv_cache_bytes=args.kv_cache_bytes,
        max_running_requests=args.max_running_requests,
        max_num_batched_tokens=args.max_num_batched_tokens,
        cuda_graph_max_batch_size=args.cuda_graph_max_batch_size,
        overlap_schedule=args.overlap_schedule,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        deterministic=args.deterministic,
        attention_backend=args.attention_backend,
    )
    for name, unset in (
        ("max_running_requests", 0),
        ("max_num_batched_tokens", 0),
        ("cuda_graph_max_batch_size", -1),
    ):
        if common[name] == unset:
            del common[name]
    if not args.kv_cache_bytes:  # auto: mem_fraction of what weights and activations leave
        del common["kv_cache_bytes"]
        common["mem_fraction"] = args.mem_fraction
    rss_before = rss_bytes()
    engine = Engine(args.model, **common)
    rss_loaded = rss_bytes()
    pool_bytes = engine.worker.kv_pool.nbytes
    pool_on_host = engine.worker.device.type == "cpu"
    sizing = engine.worker.pool_sizing
    pool_sizing = (
        None if sizing is None else {**dataclasses.asdict(sizing), "tokens": sizing.num_tokens}
    )
    graph_memory = engine.worker.graph_memory_bytes
    resolved = engine.worker.config  # the sizes the engine settled on (options left unset)
    sizes = {
        "max_running_requests": resolved.scheduler.max_running_requests,
        "max_num_batched_tokens": resolved.scheduler.max_num_batched_tokens,
        "cuda_graph_max_batch_size": resolved.model.cuda_graph_max_batch_size,
    }
    dtypes = {
        "radixmesh": str(engine.worker.dtype).replace("torch.", ""),
        "radixmesh_weights": engine.worker.quantization or "model dtype",
        "radixmesh_kv_cache": str(engine.worker.kv_pool.dtype).replace("torch.", ""),
    }
    pool_tokens = engine.worker.allocator.num_usable_slots
    make = gpu_workloads if args.workloads == "gpu" else cpu_workloads
    workloads = make(engine.tokenizer, engine.worker.arch.vocab_size)
    for w in workloads:  # warm-up: every kernel variant the runs launch is compiled here
        # (a cached-prefix extend too: the second batch reuses the first's prompts)
        for _ in range(2):
            engine.generate(
                input_ids=w.prompts[:3], sampling_params={"max_new_tokens": 4, "temperature": 0}
            )
    engine.flush_cache()
    results: dict[str, Any] = {}
    for w in workloads:
        runs = args.repeats if w.name == "throughput" else 1
        results[w.name] = {
            "workload": {**w.meta, "sampling": sampling},
            "radixmesh": run_engine_repeated(engine, w, runs, sampling),
        }
        engine.flush_cache()
    rss_after = rss_bytes()
    peak_ours = peak_rss_bytes()
    engine.shutdown()
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # an auto-sized pool sizes itself from free memory

    if not args.skip_cache_off:
        off = Engine(args.model, disable_radix_cache=True, **common)
        off.generate(input_ids=workloads[1].prompts[:2], sampling_params={"max_new_tokens": 2})
        results["shared_prefix"]["radixmesh_cache_off"] = run_engine(off, workloads[1], sampling)
        if args.workloads == "gpu":  # the radix cache's cost where nothing is shared
            results["throughput"]["radixmesh_cache_off"] = run_engine_repeated(
                off, workloads[0], args.repeats, sampling
            )
        off.shutdown()
        del off
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the baseline sizes its KV cache from free memory

    notes: list[str] = []
    if not args.skip_baseline:
        device = (
            "cuda"
            if args.device == "auto" and torch.cuda.is_available()
            else ("cpu" if args.device == "auto" else args.device)
        )
        dtype = {
            "auto": torch.bfloat16 if device == "cuda" else torch.float32,
            "float32": torch.float32,
            "bfloat16": torch.bfloat16,
            "float16": torch.float16,
        }[args.dtype]
        hf = load_hf_model(args.model, device, dtype)
        dtypes["transformers"] = str(dtype).replace("torch.", "")
        pad = hf.config.eos_token_id
        pad = pad[0] if isinstance(pad, list) else (pad or 0)
        if device == "cuda":  # its continuous batching, which warms up inside each call
            # SIGINT (`timeout -s INT`) stops a slow baseline but keeps the figures so far.
            try:
                for w in workloads:
                    results[w.name]["transformers"] = run_hf_continuous(hf, w, False)
            except KeyboardInterrupt:
                notes.append(f"transformers baseline interrupted during {w.name}")
        else:
            run_hf(hf, Workload("warm", workloads[0].prompts[:2], 4), pad, device)
            for w in workloads:
                results[w.name]["transformers"] = run_hf(hf, w, pad, device)

    memory = {
        "rss_before_engine": rss_before,
        "rss_engine_loaded": rss_loaded,
        "rss_after_workloads": rss_after,
        "peak_rss_engine_phase": peak_ours,
        "kv_pool_bytes": pool_bytes,
        "kv_pool_tokens": pool_tokens,
        "kv_budget_bytes": args.kv_cache_bytes or pool_bytes,
        "kv_pool_vs_budget": pool_bytes / (args.kv_cache_bytes or pool_bytes),
        "kv_pool_sizing": pool_sizing,
        "cuda_graph_memory_bytes": graph_memory,
        # Host RSS holds the pool only when it lives on the CPU.
        "process_minus_kv_pool": peak_ours - (pool_bytes if pool_on_host else 0),
    }
    ratios = _ratios(results)
    figures = {
        "model": args.model,
        "options": {k: v for k, v in common.items() if k not in ("device", "dtype")},
        "sizes": sizes,
        "notes": notes,
        "dtypes": dtypes,
        "results": results,
        "ratios": ratios,
        "memory": memory,
    }
    print(f"dtypes: {dtypes}")
    _print_table(results, ratios, memory)
    name = "-".join(
        n
        for n, on in (
            (args.dtype, args.dtype != "auto"),
            ("fp8w", args.quantization),
            ("fp8kv", args.kv_cache_dtype == "fp8"),
        )
        if on
    )
    record.write("offline", args, figures, name=name or None)


def _ratios(results: dict[str, Any]) -> dict[str, float]:
    r: dict[str, float] = {}
    tp = results["throughput"]
    if "transformers" in tp:
        r["throughput_vs_transformers"] = (
            tp["radixmesh"]["output_tok_per_s"] / tp["transformers"]["output_tok_per_s"]
        )
    if "radixmesh_cache_off" in tp:  # the cache's overhead where nothing is shared
        r["throughput_cache_off_vs_on"] = (
            tp["radixmesh_cache_off"]["output_tok_per_s"] / tp["radixmesh"]["output_tok_per_s"]
        )
    sp = results["shared_prefix"]
    if "radixmesh_cache_off" in sp:
        r["shared_prefix_cache_on_vs_off"] = (
            sp["radixmesh"]["req_per_s"] / sp["radixmesh_cache_off"]["req_per_s"]
        )
    if "transformers" in sp:
        r["shared_prefix_vs_transformers"] = (
            sp["radixmesh"]["req_per_s"] / sp["transformers"]["req_per_s"]
        )
    return r


def _print_table(results: dict[str, Any], ratios: dict[str, float], mem: dict[str, Any]) -> None:
    print(
        f"\n{'workload':<15}{'system':<22}{'seconds':>9}{'out tok/s':>11}{'req/s':>9}{'cached':>9}"
    )
    for name, res in results.items():
        for system, fig in res.items():
            if system == "workload":
                continue
            print(
                f"{name:<15}{system:<22}{fig['seconds']:>9.2f}{fig['output_tok_per_s']:>11.1f}"
                f"{fig['req_per_s']:>9.2f}{fig.get('cached_tokens', ''):>9}"
            )
    print()
    for k, v in ratios.items():
        print(f"{k:<34}{v:>8.2f}x")
    gb = 1 << 30
    print(
        f"peak RSS (engine phase) {mem['peak_rss_engine_phase'] / gb:.2f} GiB, KV pool "
        f"{mem['kv_pool_bytes'] / gb:.2f} GiB ({mem['kv_pool_vs_budget']:.1%} of budget), "
        f"process minus pool {mem['process_minus_kv_pool'] / gb:.2f} GiB"
    )


if __name__ == "__main__":
    main()
