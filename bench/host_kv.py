"""The host-memory KV tier: multi-turn chat whose working set outgrows the device pool,
with the tier and without it, side by side in one run; and the copy kernel's bandwidth.

Workload (`chat`): C conversations, each a system prompt of S tokens and T turns of a
U-token user message and an A-token answer (random token ids, ignore_eos). Turns run in
rounds: turn 1 of every conversation, then turn 2 of every one, ...; each turn's prompt
is the conversation's whole history, so from turn 2 on it is cached up to its new
message, if the cache still holds it. At most `--concurrency` conversations are in
flight. The device pool is shrunk (`--kv-cache-tokens`) so the conversations' history
(~C x (S + T (U + A)) tokens) is 4-8 times what it holds: without the tier, a
conversation's history is gone from the device by the time its next turn comes; with it,
it comes back from host memory. Reported per configuration: prompt tokens cached (all
turns), time to first token (queue + prefill) of turns 2.., wall time; with the tier,
bytes reloaded and written and the copies' measured bandwidth.

`copy`: the tier's copy kernel (radixmesh/worker/kvcache/host_copy.py) on a
Llama-3-8B-shaped pool, n scattered tokens each way, timed with CUDA events, beside a
plain pinned-to-device copy of the same bytes (the PCIe ceiling), for several program
counts (the kernel's grid; reloads run `LOAD_PROGRAMS`).

`stall`: whether a reload holds up the batch. 32 requests decode (128-token prompts,
ignore_eos) while prompts whose 1,024-token prefix is cached are sent one after another:
first prefixes on the device, then prefixes in host memory only (offloaded beforehand).
Each sent prompt computes one token over its prefix either way, so the two phases differ
by the reload alone. The decoders' gaps between tokens are sorted by the phase they fall
in; the medians' ratio (host over device) is the reload's cost to the batch.

GPU: `python -m bench.host_kv --model dummy:llama-3-8b --device cuda`
CPU (the mechanism, bundled SmolLM2): `python -m bench.host_kv --model smollm2 --device cpu
--conversations 8 --system-tokens 128 --kv-cache-tokens 512 --host-kv-tokens 4096`
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from bench import record
from radixmesh.worker.engine import Engine
from radixmesh.worker.kvcache.host_copy import LOAD_PROGRAMS, copy_kv
from radixmesh.worker.kvcache.host_pool import HostKVPool
from radixmesh.worker.kvcache.pool import KVPool


@dataclass(frozen=True)
class Conversation:
    system: list[int]
    users: list[list[int]]  # one message a turn


def chat_workload(args: argparse.Namespace) -> list[Conversation]:
    rng = random.Random(args.seed)
    vocab = 20_000

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    return [
        Conversation(ids(args.system_tokens), [ids(args.user_tokens) for _ in range(args.turns)])
        for _ in range(args.conversations)
    ]


async def run_chat(
    engine: Engine, convs: list[Conversation], args: argparse.Namespace
) -> dict[str, Any]:
    params = {"temperature": 0.0, "max_new_tokens": args.answer_tokens, "ignore_eos": True}
    histories = [list(c.system) for c in convs]
    sem = asyncio.Semaphore(args.concurrency)
    prompt_tokens = cached = 0
    ttft_later: list[float] = []
    cached_later = prompt_later = 0

    async def turn(i: int, t: int) -> None:
        nonlocal prompt_tokens, cached, cached_later, prompt_later
        async with sem:
            prompt = histories[i] + convs[i].users[t]
            out = await engine.async_generate(input_ids=prompt, sampling_params=params)
            assert isinstance(out, dict)
            meta = out["meta_info"]
            histories[i] = prompt + list(out["output_ids"])
            prompt_tokens += meta["prompt_tokens"]
            cached += meta["cached_tokens"]
            if t > 0:
                ttft_later.append(meta["queue_time"] + meta["prefill_time"])
                cached_later += meta["cached_tokens"]
                prompt_later += meta["prompt_tokens"]

    t0 = time.perf_counter()
    for t in range(args.turns):
        await asyncio.gather(*(turn(i, t) for i in range(len(convs))))
    wall = time.perf_counter() - t0
    ttft_later.sort()
    return {
        "wall_s": round(wall, 3),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "cached_share": round(cached / prompt_tokens, 4),
        "later_turns": {
            "prompt_tokens": prompt_later,
            "cached_tokens": cached_later,
            "ttft_p50_s": round(statistics.median(ttft_later), 4) if ttft_later else None,
            "ttft_p90_s": round(ttft_later[int(0.9 * (len(ttft_later) - 1))], 4)
            if ttft_later
            else None,
        },
    }


def chat(args: argparse.Namespace) -> dict[str, Any]:
    convs = chat_workload(args)
    history = args.system_tokens + args.turns * (args.user_tokens + args.answer_tokens)
    results: dict[str, Any] = {
        "workload": {
            "conversations": args.conversations,
            "turns": args.turns,
            "system_tokens": args.system_tokens,
            "user_tokens": args.user_tokens,
            "answer_tokens": args.answer_tokens,
            "concurrency": args.concurrency,
            "working_set_tokens": args.conversations * history,
            "device_pool_tokens": args.kv_cache_tokens,
            "working_set_over_pool": round(args.conversations * history / args.kv_cache_tokens, 2),
        }
    }
    configs = [("device_only", 0, "write_through")]
    for i, policy in enumerate(args.write_policies.split(",")):
        configs.append(
            ("host_tier" if i == 0 else f"host_tier_{policy}", args.host_kv_tokens, policy)
        )
    for name, host_tokens, policy in configs:
        engine = Engine(
            args.model,
            device=args.device,
            kv_cache_tokens=args.kv_cache_tokens,
            max_running_requests=args.concurrency,
            host_kv_cache_bytes=(host_tokens + 1) * _bytes_per_token(args) if host_tokens else 0,
            host_kv_write_policy=policy,
        )
        try:
            asyncio.run(run_chat(engine, convs[:2], _warm(args)))  # compile, graphs, first use
            engine.flush_cache()
            res = asyncio.run(run_chat(engine, convs, args))
            stats = engine.get_stats()
            if host_tokens:
                res["write_policy"] = policy
                res["host"] = {
                    "tokens": stats.host_kv_slots_total,
                    "hit_tokens": stats.host_cache_hit_tokens,
                    "bytes_loaded": stats.host_kv_bytes_loaded,
                    "bytes_written": stats.host_kv_bytes_written,
                    "load_gb_s": round(stats.host_kv_load_bandwidth / 1e9, 2),
                    "write_gb_s": round(stats.host_kv_write_bandwidth / 1e9, 2),
                }
            results[name] = res
        finally:
            engine.shutdown()
            del engine
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    off, on = results["device_only"], results["host_tier"]
    results["ratios"] = {
        "cached_tokens": round(on["cached_tokens"] / max(1, off["cached_tokens"]), 2),
        "ttft_p50_speedup": round(
            off["later_turns"]["ttft_p50_s"] / on["later_turns"]["ttft_p50_s"], 2
        ),
        "wall_speedup": round(off["wall_s"] / on["wall_s"], 2),
        "wall_s_by_config": {k: v["wall_s"] for k, v in results.items() if "wall_s" in v},
    }
    return results


def _warm(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "turns": 1})


_SHAPES = {"dummy:llama-3-8b": (32, 8, 128), "smollm2": (30, 3, 64)}


def _bytes_per_token(args: argparse.Namespace) -> int:
    layers, heads, dim = _SHAPES[args.model]
    itemsize = 2 if args.device == "cuda" else 4
    return 2 * layers * heads * dim * itemsize


def copy_bench(args: argparse.Namespace) -> dict[str, Any]:
    layers, heads, dim = _SHAPES["dummy:llama-3-8b"]
    pool = KVPool(
        num_slots=args.copy_pool_tokens,
        num_layers=layers,
        num_kv_heads=heads,
        head_dim=dim,
        dtype=torch.bfloat16,
        device="cuda",
    )
    host = HostKVPool(pool, args.copy_tokens * 2 + 1, pin=True)
    gen = torch.Generator().manual_seed(0)
    n = args.copy_tokens
    dev = torch.randperm(args.copy_pool_tokens - 1, generator=gen)[:n] + 1
    hs = torch.randperm(2 * n, generator=gen)[:n] + 1
    dev_cuda, hs_cuda = dev.cuda(), hs.cuda()
    nbytes = n * HostKVPool.bytes_per_slot(pool)

    def timed(fn: Any) -> float:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(args.reps):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        return statistics.median(times)

    sweep = {}
    for programs in (16, 32, 64, 132, 264, 0):
        t_out = timed(
            lambda p=programs: copy_kv(pool, host, dev_cuda, hs_cuda, to_host=True, programs=p)
        )
        t_back = timed(
            lambda p=programs: copy_kv(pool, host, dev_cuda, hs_cuda, to_host=False, programs=p)
        )
        sweep[str(programs)] = {
            "to_host_gb_s": round(nbytes / 1e9 / t_out, 2),
            "to_device_gb_s": round(nbytes / 1e9 / t_back, 2),
        }
    # As the tier runs them: copies out with a program per row, reloads with LOAD_PROGRAMS.
    to_host = timed(lambda: copy_kv(pool, host, dev_cuda, hs_cuda, to_host=True))
    to_dev = timed(
        lambda: copy_kv(pool, host, dev_cuda, hs_cuda, to_host=False, programs=LOAD_PROGRAMS)
    )
    flat = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    flat_dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    ref_h2d = timed(lambda: flat_dev.copy_(flat, non_blocking=True))
    ref_d2h = timed(lambda: flat.copy_(flat_dev, non_blocking=True))
    # The bytes came back where they were.
    back = pool.k_buffers[3][dev_cuda].clone()
    pool.k_buffers[3].zero_()
    copy_kv(pool, host, dev_cuda, hs_cuda, to_host=False)
    torch.cuda.synchronize()
    assert torch.equal(pool.k_buffers[3][dev_cuda], back)
    gb = nbytes / 1e9
    return {
        "tokens": n,
        "bytes": nbytes,
        "kernel_to_host_gb_s": round(gb / to_host, 2),
        "kernel_to_device_gb_s": round(gb / to_dev, 2),
        "pinned_copy_to_host_gb_s": round(gb / ref_d2h, 2),
        "pinned_copy_to_device_gb_s": round(gb / ref_h2d, 2),
        "kernel_over_copy_to_device": round(ref_h2d / to_dev, 3),
        "kernel_over_copy_to_host": round(ref_d2h / to_host, 3),
        "load_programs": LOAD_PROGRAMS,
        "by_programs": sweep,
    }


def stall(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed + 1)
    prefix, n_pre, n_dec = args.stall_prefix, args.stall_prompts, args.stall_decoders

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 20_000) for _ in range(n)]

    host_prompts = [ids(prefix) for _ in range(n_pre)]
    device_prompts = [ids(prefix) for _ in range(n_pre)]
    engine = Engine(
        args.model,
        device=args.device,
        # Room for both prompt sets and every decoder: nothing is evicted during the run.
        kv_cache_tokens=2 * n_pre * (prefix + 2) + n_dec * (130 + args.stall_decode_tokens) + 1024,
        max_running_requests=n_dec + 8,
        host_kv_cache_bytes=(2 * n_pre * prefix + 1) * _bytes_per_token(args),
    )
    one = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
    try:
        engine.generate(input_ids=host_prompts, sampling_params=one)
        engine.call(lambda: engine.worker.cache.evict(1 << 40))  # all of it to host memory
        engine.generate(input_ids=device_prompts, sampling_params=one)
        stats0 = engine.get_stats()
        out = asyncio.run(_stall_run(engine, host_prompts, device_prompts, ids, n_dec, args))
        stats = engine.get_stats()
    finally:
        engine.shutdown()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    out["host_hit_tokens"] = stats.host_cache_hit_tokens - stats0.host_cache_hit_tokens
    return out


async def _stall_run(
    engine: Engine,
    host_prompts: list[list[int]],
    device_prompts: list[list[int]],
    ids: Any,
    n_dec: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    decode = {"temperature": 0.0, "max_new_tokens": args.stall_decode_tokens, "ignore_eos": True}
    stamps: list[list[float]] = [[] for _ in range(n_dec)]

    async def decoder(i: int) -> None:
        stream = await engine.async_generate(
            input_ids=ids(128), sampling_params=decode, stream=True
        )
        async for _ in stream:  # type: ignore[union-attr]
            stamps[i].append(time.perf_counter())

    windows: dict[str, list[tuple[float, float]]] = {"device": [], "host": []}

    async def send(phase: str, prompts: list[list[int]]) -> None:
        one = {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
        for p in prompts:
            t0 = time.perf_counter()
            await engine.async_generate(input_ids=p + ids(1), sampling_params=one)
            windows[phase].append((t0, time.perf_counter()))

    async def inject() -> None:
        await asyncio.sleep(args.stall_lead_s)
        await send("device", device_prompts)
        await asyncio.sleep(args.stall_lead_s / 2)
        await send("host", host_prompts)

    await asyncio.gather(*(decoder(i) for i in range(n_dec)), inject())
    gaps: dict[str, list[float]] = {"device": [], "host": [], "none": []}
    for s in stamps:
        for a, b in itertools.pairwise(s[1:]):  # from the first token on
            mid = (a + b) / 2
            phase = next(
                (k for k, ws in windows.items() if any(w0 <= mid <= w1 for w0, w1 in ws)), "none"
            )
            gaps[phase].append(b - a)
    med = {k: statistics.median(v) * 1e3 if v else None for k, v in gaps.items()}
    return {
        "decoders": n_dec,
        "prefix_tokens": len(host_prompts[0]),
        "itl_ms_p50": {k: round(v, 3) if v else None for k, v in med.items()},
        "itl_ms_p90": {
            k: round(sorted(v)[int(0.9 * (len(v) - 1))] * 1e3, 3) if v else None
            for k, v in gaps.items()
        },
        "gaps": {k: len(v) for k, v in gaps.items()},
        "host_over_device_p50": round(med["host"] / med["device"], 3)
        if med["host"] and med["device"]
        else None,
        "send_ms_p50": {
            k: round(statistics.median(b - a for a, b in ws) * 1e3, 2)
            for k, ws in windows.items()
            if ws
        },
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="dummy:llama-3-8b", choices=sorted(_SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--conversations", type=int, default=96)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=1536)
    ap.add_argument("--user-tokens", type=int, default=64)
    ap.add_argument("--answer-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kv-cache-tokens", type=int, default=32_768)
    ap.add_argument("--host-kv-tokens", type=int, default=262_144)
    ap.add_argument(
        "--write-policies",
        default="write_back,write_through",
        help="host tier runs, one per policy; the first is reported as host_tier",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", default="copy,stall,chat")
    ap.add_argument("--copy-tokens", type=int, default=8192)
    ap.add_argument("--copy-pool-tokens", type=int, default=65_536)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--stall-decode-tokens", type=int, default=1024)
    ap.add_argument("--stall-prefix", type=int, default=1024)
    ap.add_argument("--stall-prompts", type=int, default=32)
    ap.add_argument("--stall-decoders", type=int, default=32)
    ap.add_argument("--stall-lead-s", type=float, default=1.0)
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    figures: dict[str, Any] = {}
    if "copy" in parts and torch.cuda.is_available():
        figures["copy"] = copy_bench(args)
        print("copy:", figures["copy"])
    if "stall" in parts:
        figures["stall"] = stall(args)
        print("stall:", figures["stall"])
    if "chat" in parts:
        figures["chat"] = chat(args)
        c = figures["chat"]
        print(f"{'':12} {'wall s':>8} {'cached':>8} {'share':>6} {'TTFT p50':>9} {'TTFT p90':>9}")
        for name in [k for k in c if k.startswith(("device_only", "host_tier"))]:
            r = c[name]
            lt = r["later_turns"]
            print(
                f"{name:12} {r['wall_s']:8.2f} {r['cached_tokens']:8d} {r['cached_share']:6.2f} "
                f"{lt['ttft_p50_s']:9.4f} {lt['ttft_p90_s']:9.4f}"
            )
        print("ratios:", c["ratios"], "host:", c["host_tier"].get("host"))
    record.write("host_kv", args, figures)


if __name__ == "__main__":
    main()
