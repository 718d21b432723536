"""Attention backends side by side on the GPU: triton vs flashinfer, the same inputs, the
same call the model makes (`prepare` once a step, then `forward` per layer: the KV store
and attention), at Llama-3-8B's heads (Hq 32, Hkv 8, D 128), bfloat16 pool.

Shapes (batch x context over a shuffled slot table):
  decode        256 x 768, 256 x 4,096, 64 x 2,048, 1 x 4,096
  shared        256 decode rows over one 1,536-token prefix (+ 64 own each), and in 16
                groups of 16 over 16 such prefixes (P2's decode): the radix cache's
                sharing, which the flashinfer backend reads once per group (its cascade,
                shared_prefix.py), the triton backend once per row, and the triton backend
                with its shared-prefix decode (triton-shared: kernels/decode_shared.py)
                once per chunk of up to 16 rows
  extend        16 x 512 new over 1,536 cached (P2's prefill), 16 x 512 and 1 x 8,192 new
                with no prefix, causal
  mixed         8 x 512 new prompts beside 192 decode rows at 768 (a chunked step)
Each shape: both outputs against the float64 reference of a few rows (relative error),
then the time of one layer's `forward` (CUDA events, median of do_bench), the same call's
kernel time (the sum of its kernels' durations in a profile, L2 flushed before each call:
what the step anatomy counts as attention, without the idle gaps of eager launches),
`prepare`'s wall time (host + device, synchronized), KV TB/s for decode and TFLOP/s for
extend.

`--shared-sweep` runs only the shared shapes through kernels/decode_shared.py at each
launch of SHARED_GRID (key tile, warps, stages), prefix split count and rows a chunk,
kernel time each,
and prints the best beside the backend's own choice.

`--engine` adds the whole engine's batch-1 decode on `dummy:llama-3-8b` with each backend:
one 512-token prompt, 256 greedy new tokens (after a warm-up request), milliseconds per
output token from the wall time less the prefill's (a max_new_tokens=1 request).

Run on a CUDA machine with flashinfer installed: `python -m bench.attention_backends
[--engine] [--out FILE]` (`--backends triton,triton-shared` without flashinfer). Prints
a table; writes its record to bench/results/attention_backends-<machine>.json.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import random
import time
from collections.abc import Callable
from typing import Any

import torch
from triton.testing import do_bench

from bench import record
from radixmesh.worker.attention.registry import create_attention_backend
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.kvcache.pool import KVPool

HQ, HKV, D = 32, 8, 128
DTYPE = torch.bfloat16
DEV = torch.device("cuda")
# flashinfer-flat: the flashinfer backend without its shared-prefix cascade, every row
# read in full (what the cascade saves). (FA2's prefill kernels against FA3's, the choice
# of flashinfer_backend.PREFILL_BACKEND, are in docs/performance.md.)
# triton-shared: the triton backend with its shared-prefix decode on; triton-shared-graph:
# the same with a decode graph's metadata (the launches a replay runs, here without one);
# triton-shared-fused: that with the one-launch kernel (RADIXMESH_SHARED_PREFIX_FUSED).
BACKENDS = ("triton", "triton-shared", "flashinfer", "flashinfer-flat")
LAYER = 0
GRAPH_CONTEXT = 8192  # triton-shared-graph: the context its graphs are captured for


Shape = tuple[str, list[tuple[int, int]], tuple[int, int]]


def shapes() -> list[Shape]:
    """(name, [(prefix, new)] per sequence, (groups, shared prefix length)): row r shares
    its group's (r % groups) prefix."""
    none = (1, 0)
    return [
        ("decode 256 x 768", [(767, 1)] * 256, none),
        ("decode 256 x 4096", [(4095, 1)] * 256, none),
        ("decode 64 x 2048", [(2047, 1)] * 64, none),
        ("decode 1 x 4096", [(4095, 1)], none),
        ("shared 256 x (1536 + 64)", [(1599, 1)] * 256, (1, 1536)),
        ("shared 16 x 16 x (1536 + 64)", [(1599, 1)] * 256, (16, 1536)),
        ("extend 16 x 512 over 1536", [(1536, 512)] * 16, none),
        ("extend 16 x 512", [(0, 512)] * 16, none),
        ("extend 1 x 8192", [(0, 8192)], none),
        ("mixed 8 x 512 + 192 x 768", [(0, 512)] * 8 + [(767, 1)] * 192, none),
    ]


def build_case(
    seqs: list[tuple[int, int]], sharing: tuple[int, int], seed: int
) -> tuple[KVPool, ForwardBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pool filled with random K/V, each sequence on shuffled slots (the first `shared`
    slots of every sequence of a group the same ones), and new q/k/v. The batch carries
    the table's host copy, as the engine's does (the cascade reads it)."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    groups, shared = sharing
    own = sum(p + n - shared for p, n in seqs)
    slots_total = groups * shared + own + 1
    pool = KVPool(num_slots=slots_total, num_layers=1, num_kv_heads=HKV, head_dim=D,
                  dtype=DTYPE, device=DEV)  # fmt: skip
    for buf in (pool.k_buffers[LAYER], pool.v_buffers[LAYER]):
        buf.copy_(torch.randn(buf.shape, generator=gen, device=DEV, dtype=torch.float32).to(DTYPE))
    rng = random.Random(seed)
    free = list(range(1, slots_total))
    rng.shuffle(free)
    prefix_slots = [[free.pop() for _ in range(shared)] for _ in range(groups)]
    max_len = max(p + n for p, n in seqs)
    table = torch.zeros((len(seqs), max_len), dtype=torch.int64)
    new_slots: list[int] = []
    for row, (p, n) in enumerate(seqs):
        mine = prefix_slots[row % groups] + [free.pop() for _ in range(p + n - shared)]
        table[row, : p + n] = torch.tensor(mine)
        new_slots += mine[p:]
    t = sum(n for _, n in seqs)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=DEV, dtype=torch.float32).to(DTYPE)

    batch = ForwardBatch.build(
        input_ids=[0] * t,
        out_cache_loc=torch.tensor(new_slots),
        req_rows=list(range(len(seqs))),
        prefix_lens=[p for p, _ in seqs],
        extend_lens=[n for _, n in seqs],
        req_to_token=table.to(DEV),
    )
    batch.req_to_token_host = table.numpy()
    return pool, batch, rand(t, HQ, D), rand(t, HKV, D), rand(t, HKV, D)


def reference_rows(
    pool: KVPool, batch: ForwardBatch, q: torch.Tensor, rows: list[int]
) -> torch.Tensor:
    """float64 attention of the new tokens at q rows `rows` (after the store)."""
    k_all, v_all = pool.k_buffers[LAYER], pool.v_buffers[LAYER]
    starts = [0]
    for n in batch.extend_lens_cpu:
        starts.append(starts[-1] + n)
    out = []
    for r in rows:
        b = next(i for i in range(batch.batch_size) if starts[i] <= r < starts[i + 1])
        visible = batch.prefix_lens_cpu[b] + (r - starts[b]) + 1
        slots = batch.req_to_token[b, :visible]
        k = k_all[slots].double().repeat_interleave(HQ // HKV, dim=1)  # [L, Hq, D]
        v = v_all[slots].double().repeat_interleave(HQ // HKV, dim=1)
        s = torch.einsum("hd,lhd->hl", q[r].double(), k) * D**-0.5
        out.append(torch.einsum("hl,lhd->hd", torch.softmax(s, -1), v))
    return torch.stack(out)


def make_backend(name: str, pool: KVPool) -> Any:
    if name in ("triton-shared", "triton-shared-graph", "triton-shared-fused"):
        from radixmesh.worker.attention.triton_backend import TritonAttentionBackend

        triton_backend = create_attention_backend("triton", pool, D**-0.5)
        assert isinstance(triton_backend, TritonAttentionBackend)
        triton_backend.shared_prefix = True
        triton_backend.shared_fused = name == "triton-shared-fused"
        return triton_backend
    if name != "flashinfer-flat":
        return create_attention_backend(name, pool, D**-0.5)
    from radixmesh.worker.attention.flashinfer_backend import FlashInferAttentionBackend

    backend = create_attention_backend("flashinfer", pool, D**-0.5)
    assert isinstance(backend, FlashInferAttentionBackend)
    backend.cascade = False
    return backend


def prepare(name: str, attn: Any, batch: ForwardBatch) -> None:
    """`attn.prepare`, or for triton-shared-graph/-fused a decode step's metadata as a graph
    of the batch's size holds it (`graph_metadata` for a 8,192-token context, the variant
    `graph_variant` picks, `before_replay`): the graph's launches, run without a graph."""
    if name not in ("triton-shared-graph", "triton-shared-fused") or not batch.is_decode_only:
        attn.prepare(batch)
        return
    b = batch.batch_size
    if attn.graph_variants(b) == 2:
        attn.graph_metadata(b, GRAPH_CONTEXT, HQ, 1)  # the size's shared-prefix graph
    batch.attn_metadata = attn.graph_metadata(b, GRAPH_CONTEXT, HQ, attn.graph_variant(batch, b))
    attn.before_replay(batch, batch, 0)


def measure(
    name: str, seqs: list[tuple[int, int]], sharing: tuple[int, int], backends: list[str]
) -> dict[str, Any]:
    pool, batch, q, k, v = build_case(seqs, sharing, seed=len(name))
    t = q.shape[0]
    rows = sorted({0, t // 3, t - 1})
    kv_tokens = sum(p + n for p, n in seqs)  # read per row, shared or not: the work's size
    kv_bytes = 2 * kv_tokens * HKV * D * DTYPE.itemsize
    causal_flops = sum(4 * n * (p + (n + 1) / 2) * HQ * D for p, n in seqs)
    row: dict[str, Any] = {"shape": name, "tokens": t, "kv_tokens": kv_tokens}
    for backend_name in backends:
        attn = make_backend(backend_name, pool)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        prepare(backend_name, attn, batch)
        out = attn.forward(q, k, v, LAYER, batch)  # the first layer plans
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - t0) * 1e3
        ref = reference_rows(pool, batch, q, rows)
        got = out[rows].double()
        rel = float((got - ref).norm() / ref.norm())
        forward = functools.partial(attn.forward, q, k, v, LAYER, batch)
        ms = do_bench(forward, warmup=10, rep=60)
        kernels = kernel_times(forward)
        prep = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            prepare(backend_name, attn, batch)
            attn.forward(q, k, v, LAYER, batch)
            torch.cuda.synchronize()
            prep.append((time.perf_counter() - t0) * 1e3 - ms)
        row[backend_name] = {
            "kind": type(batch.attn_metadata).__name__,
            "ms": ms,
            "kernel_ms": sum(kernels.values()),
            "kernels_ms": kernels,
            "rel_err": rel,
            "first_call_ms": first_ms,
            "prepare_ms": sorted(prep)[len(prep) // 2],
            "tb_per_s": kv_bytes / (ms * 1e-3) / 1e12,
            "tflops": causal_flops / (ms * 1e-3) / 1e12,
        }
        del attn, forward
    for name_ in backends[1:]:
        row[f"{name_}_over_triton_time"] = row[name_]["ms"] / row[backends[0]]["ms"]
        row[f"{name_}_over_triton_kernel_time"] = (
            row[name_]["kernel_ms"] / row[backends[0]]["kernel_ms"]
        )
    return row


def kernel_times(fn: Callable[[], Any], reps: int = 20) -> dict[str, float]:
    """Milliseconds per call of `fn` in each GPU kernel, by name (durations summed, gaps
    between kernels not counted), the L2 flushed before each call by a kernel left out."""
    from torch.profiler import ProfilerActivity, profile

    from bench.anatomy.kernel_trace import trace_events

    flush = torch.empty(256 << 20, dtype=torch.int8, device=DEV)  # 5x the L2
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.bitwise_not_()
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in trace_events(prof):
        if e.on_device and "bitwise_not" not in e.name and not e.name.startswith("Memcpy"):
            name = e.name[:60]
            out[name] = out.get(name, 0.0) + (e.end - e.start) / reps / 1e6
    return out


def kernel_time_ms(fn: Callable[[], Any], reps: int = 20) -> float:
    """All of `fn`'s kernels' milliseconds per call (`kernel_times`)."""
    return sum(kernel_times(fn, reps).values())


# (key tile, warps, stages) for the shared-prefix kernels, and prefix split counts
SHARED_GRID = [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 4, 3), (64, 8, 2), (128, 8, 2),
               (32, 4, 2), (32, 8, 2)]  # fmt: skip
SHARED_SPLITS = [1, 2, 4]
SHARED_CHUNK_ROWS = [16, 32]  # batch rows a chunk (x 4 query heads: 64 or 128 query rows)


def shared_sweep() -> list[dict[str, Any]]:
    """kernels/decode_shared.py on the shared shapes at every SHARED_GRID launch and prefix
    split count: kernel ms each, against the flat kernel's and the backend's choice."""
    out = []
    for name, seqs, sharing in shapes():
        if not name.startswith("shared"):
            continue
        r = sweep_shape(name, seqs, sharing)
        out.append(r)
        best, flat = r["best"], r["flat_kernel_ms"]
        print(f"{name}: flat {flat * 1e3:.0f} us, shared as the backend runs it "
              f"{r['backend_kernel_ms'] * 1e3:.0f} us (prefix splits "
              f"{r['backend_prefix_splits']}), best {best['kernel_ms'] * 1e3:.0f} us at "
              f"{best['launch']} x {best['splits']} splits, {best['chunk_rows']} rows a chunk "
              f"({best['kernel_ms'] / flat:.2f}x "
              "flat)", flush=True)  # fmt: skip
    return out


def sweep_shape(name: str, seqs: list[tuple[int, int]], sharing: tuple[int, int]) -> dict[str, Any]:
    from radixmesh.worker.attention.kernels.decode_attention import DecodeConfig
    from radixmesh.worker.attention.kernels.decode_shared import (
        chunk_lists,
        decode_attention_shared,
        prefix_chunks,
    )

    pool, batch, q, k, v = build_case(seqs, sharing, seed=3)
    flat = make_backend("triton", pool)
    flat.prepare(batch)
    flat_ms = kernel_time_ms(lambda: flat.forward(q, k, v, LAYER, batch))
    attn = make_backend("triton-shared", pool)
    attn.prepare(batch)
    attn.forward(q, k, v, LAYER, batch)  # stores k/v; the first layer makes the chunks
    meta = batch.attn_metadata
    backend_ms = kernel_time_ms(lambda: attn.forward(q, k, v, LAYER, batch))
    k_buf, v_buf = pool.k_buffers[LAYER], pool.v_buffers[LAYER]
    o = torch.empty_like(q)
    rows = [0, q.shape[0] // 2, q.shape[0] - 1]
    ref = reference_rows(pool, batch, q, rows)
    runs: list[dict[str, Any]] = []
    grid = itertools.product(SHARED_GRID, SHARED_SPLITS, SHARED_CHUNK_ROWS)
    for (block_n, warps, stages), splits, per_chunk in grid:
        cfg = DecodeConfig(block_n, warps, stages)
        lists = chunk_lists(meta.groups, batch.seq_lens_cpu, per_chunk)
        assert lists is not None
        chunks = prefix_chunks(lists, splits, per_chunk, lambda t: t.to(DEV))

        def call(cfg: DecodeConfig = cfg, chunks: Any = chunks) -> None:
            decode_attention_shared(
                q, k_buf, v_buf, o, batch.req_to_token, batch.req_rows, batch.seq_lens,
                D**-0.5, chunks, meta.own_splits, config=cfg,
            )  # fmt: skip

        run: dict[str, Any] = {
            "launch": [block_n, warps, stages],
            "splits": splits,
            "chunk_rows": per_chunk,
        }
        try:
            call()
        except Exception as e:  # a launch the device cannot take (shared memory)
            runs.append({**run, "error": type(e).__name__})
            continue
        rel = float((o[rows].double() - ref).norm() / ref.norm())
        runs.append({**run, "kernel_ms": kernel_time_ms(call), "rel_err": rel})
    best = min((r for r in runs if "kernel_ms" in r), key=lambda r: float(r["kernel_ms"]))
    return {"shape": name, "flat_kernel_ms": flat_ms, "backend_kernel_ms": backend_ms,
            "backend_prefix_splits": meta.chunks.max_splits, "backend_own_splits": meta.own_splits,
            "best": best, "runs": runs}  # fmt: skip


def batch1_ms_per_token(backend: str, new_tokens: int = 256) -> dict[str, Any]:
    """The engine's batch-1 decode: ms per output token past the first."""
    from radixmesh.worker.engine import Engine

    prompt = [random.Random(1).randrange(3, 30000) for _ in range(512)]
    with Engine("dummy:llama-3-8b", attention_backend=backend, kv_cache_tokens=1 << 16,
                max_running_requests=8, cuda_graph_max_batch_size=8) as eng:  # fmt: skip

        def run(n: int) -> float:
            t0 = time.perf_counter()
            eng.generate(input_ids=prompt, sampling_params={
                "temperature": 0.0, "max_new_tokens": n, "ignore_eos": True})  # fmt: skip
            return time.perf_counter() - t0

        run(new_tokens)  # warm-up: graphs, allocator, the radix cache emptied below
        prefill, total = [], []
        for _ in range(3):
            eng.flush_cache()
            prefill.append(run(1))
            eng.flush_cache()
            total.append(run(new_tokens))
    p, t = sorted(prefill)[1], sorted(total)[1]
    return {"backend": backend, "prefill_s": p, "total_s": t,
            "ms_per_token": (t - p) / (new_tokens - 1) * 1e3}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    record.add_output_arguments(ap)
    ap.add_argument("--engine", action="store_true", help="also the engine's batch-1 decode")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="the first is the baseline")
    ap.add_argument("--shared-sweep", action="store_true", help="only the shared-prefix sweep")
    args = ap.parse_args(argv)
    if args.shared_sweep:
        torch.manual_seed(0)
        path = record.write("attention_shared_sweep", args, {"runs": shared_sweep()})
        print(f"wrote {path}")
        return
    backends = args.backends.split(",")
    fi_version = None
    if any(b.startswith("flashinfer") for b in backends):
        import flashinfer  # the comparison needs it: fail here, not in the middle

        fi_version = flashinfer.__version__

    torch.manual_seed(0)
    rows = []
    names = ", ".join(backends)
    print(f"shape | us: {names} | each / {backends[0]} | kernel us | kernel each / "
          f"{backends[0]} | TB/s | TFLOP/s | prepare ms | rel err  (each: {names})")  # fmt: skip
    for name, seqs, sharing in shapes():
        r = measure(name, seqs, sharing, backends)
        rows.append(r)
        each = [r[b] for b in backends]

        def cols(key: str, fmt: str, scale: float = 1.0, each: list[Any] = each) -> str:
            return ", ".join(format(x[key] * scale, fmt) for x in each)

        ratios = ", ".join(f"{r[f'{b}_over_triton_time']:.2f}" for b in backends[1:])
        kratios = ", ".join(f"{r[f'{b}_over_triton_kernel_time']:.2f}" for b in backends[1:])
        print(f"{name} | {cols('ms', '.0f', 1e3)} | {ratios} | {cols('kernel_ms', '.0f', 1e3)} | "
              f"{kratios} | {cols('tb_per_s', '.2f')} | "
              f"{cols('tflops', '.0f')} | {cols('prepare_ms', '.2f')} | {cols('rel_err', '.1e')}",
              flush=True)  # fmt: skip
        if name.startswith("shared"):
            for b in backends:
                parts = sorted(r[b]["kernels_ms"].items(), key=lambda kv: -kv[1])
                print(f"  {b}: " + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in parts), flush=True)
    report = {
        "shapes": {"num_heads": HQ, "num_kv_heads": HKV, "head_dim": D, "dtype": "bfloat16"},
        "backends": backends,
        "flashinfer_version": fi_version,
        "rows": rows,
    }
    if args.engine:
        report["batch1"] = [batch1_ms_per_token(b) for b in ("triton", "flashinfer")]
        for r in report["batch1"]:
            print(f"batch 1, {r['backend']}: {r['ms_per_token']:.2f} ms per token "
                  f"(prefill {r['prefill_s'] * 1e3:.1f} ms)", flush=True)  # fmt: skip
    path = record.write("attention_backends", args, report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
