"""The torch attention backend against a naive float64 reference over the slot table."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.attention.registry import (
    available_attention_backends,
    create_attention_backend,
)
from radixmesh.worker.attention.torch_backend import TorchAttentionBackend
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.kvcache.fp8_kv import FP8, dequantize_kv
from radixmesh.worker.kvcache.pool import KVPool

HEAD_DIM = 16
NUM_SLOTS = 512
LAYER = 1  # of 2: the other layer must stay untouched
# (prefix_len, extend_len) per sequence: decode rows (extend 1, even with no prefix)
# interleaved with extend rows with and without a prefix.
MIXED = [(0, 7), (5, 1), (12, 9), (0, 1), (30, 1), (3, 4), (17, 1), (0, 2)]


def make_case(
    seqs: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    head_dim: int = HEAD_DIM,
) -> tuple[KVPool, ForwardBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pool whose prefixes are already filled with random K/V, a batch over shuffled
    (non-contiguous) slots and random rows of the req->token table, and new q/k/v."""
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(
        num_slots=NUM_SLOTS,
        num_layers=2,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
    )
    req_to_token = torch.zeros(16, 64, dtype=torch.int64)
    free = (torch.randperm(NUM_SLOTS - 1, generator=gen) + 1).tolist()
    rows = torch.randperm(16, generator=gen)[: len(seqs)].tolist()
    new_slots = []
    for row, (prefix, extend) in zip(rows, seqs, strict=True):
        slots = torch.tensor([free.pop() for _ in range(prefix + extend)])
        req_to_token[row, : prefix + extend] = slots
        kv_shape = (prefix, num_kv_heads, head_dim)
        prefix_slots = slots[:prefix].to(device)
        for buf in (pool.k_buffers[LAYER], pool.v_buffers[LAYER]):
            buf[prefix_slots] = torch.randn(kv_shape, generator=gen).to(dtype=dtype, device=device)
        new_slots.append(slots[prefix:])
    t = sum(e for _, e in seqs)
    q = torch.randn(t, num_heads, head_dim, generator=gen).to(dtype=dtype, device=device)
    k = torch.randn(t, num_kv_heads, head_dim, generator=gen).to(dtype=dtype, device=device)
    v = torch.randn(t, num_kv_heads, head_dim, generator=gen).to(dtype=dtype, device=device)
    batch = ForwardBatch.build(
        input_ids=[0] * t,
        out_cache_loc=torch.cat(new_slots),
        req_rows=rows,
        prefix_lens=[p for p, _ in seqs],
        extend_lens=[e for _, e in seqs],
        req_to_token=req_to_token.to(device),
    )
    return pool, batch, q, k, v


def reference(pool: KVPool, batch: ForwardBatch, q: torch.Tensor, scale: float) -> torch.Tensor:
    """Loop over sequences and heads; explicit causal softmax in float64."""
    k_all = pool.k_buffers[LAYER].double().cpu()
    v_all = pool.v_buffers[LAYER].double().cpu()
    q = q.double().cpu()
    group = q.shape[1] // k_all.shape[1]
    out = torch.empty_like(q)
    start = 0
    for b in range(batch.batch_size):
        prefix, extend = batch.prefix_lens_cpu[b], batch.extend_lens_cpu[b]
        slots = batch.req_to_token[batch.req_rows[b], : prefix + extend].cpu()
        for i in range(extend):
            visible = slots[: prefix + i + 1]
            for h in range(q.shape[1]):
                scores = k_all[visible, h // group] @ q[start + i, h] * scale  # [L]
                weights = torch.exp(scores - scores.max())
                out[start + i, h] = (weights / weights.sum()) @ v_all[visible, h // group]
        start += extend
    return out


def run(
    pool: KVPool, batch: ForwardBatch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, float]:
    scale = HEAD_DIM**-0.5
    backend = create_attention_backend("torch", pool, scale)
    backend.prepare(batch)
    return backend.forward(q, k, v, LAYER, batch), scale


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 2), (4, 4)], ids=["gqa4", "mha"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mixed_batch_matches_reference(num_heads: int, num_kv_heads: int, seed: int) -> None:
    seqs = [
        MIXED[i] for i in torch.randperm(len(MIXED), generator=torch.Generator().manual_seed(seed))
    ]
    pool, batch, q, k, v = make_case(seqs, num_heads, num_kv_heads, seed=seed)
    out, scale = run(pool, batch, q, k, v)
    assert out.shape == q.shape and out.dtype == torch.float32
    assert (out.double() - reference(pool, batch, q, scale)).abs().max() < 1e-5


@pytest.mark.parametrize(
    "seqs",
    [
        [(10, 1), (0, 1), (33, 1), (7, 1)],
        [(14, 1), (14, 1), (14, 1)],
        [(0, 12)],
        [(9, 5), (0, 3)],
        [(20, 1)],
        [(21, 5)],  # a drafting row (its last token and 4 drafts) on the CPU
        [(4, 1), (6, 3), (2, 1)],  # one extend row among decode rows
    ],
    ids=[
        "decode-only",
        "decode-equal-lengths",
        "one-prompt",
        "extends-only",
        "single-decode",
        "one-row-after-a-prefix",
        "one-extend-among-decodes",
    ],
)
def test_homogeneous_batches_match_reference(seqs: list[tuple[int, int]]) -> None:
    pool, batch, q, k, v = make_case(seqs, 8, 2)
    out, scale = run(pool, batch, q, k, v)
    assert (out.double() - reference(pool, batch, q, scale)).abs().max() < 1e-5


def test_new_kv_lands_in_its_slots_of_its_layer_only() -> None:
    pool, batch, q, k, v = make_case(MIXED, 8, 2)
    before = [buf.clone() for buf in pool.k_buffers + pool.v_buffers]
    run(pool, batch, q, k, v)
    loc = batch.out_cache_loc
    assert torch.equal(pool.k_buffers[LAYER][loc], k)
    assert torch.equal(pool.v_buffers[LAYER][loc], v)
    untouched = torch.ones(NUM_SLOTS, dtype=torch.bool)
    untouched[loc] = False
    assert torch.equal(pool.k_buffers[LAYER][untouched], before[LAYER][untouched])
    assert torch.equal(pool.k_buffers[0], before[0]) and torch.equal(pool.v_buffers[0], before[2])


def test_bfloat16_stays_bfloat16_and_close() -> None:
    pool, batch, q, k, v = make_case(MIXED, 8, 2, dtype=torch.bfloat16)
    out, scale = run(pool, batch, q, k, v)
    assert out.dtype == torch.bfloat16
    assert (out.double() - reference(pool, batch, q, scale)).abs().max() < 3e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_reference(dtype: torch.dtype) -> None:
    pool, batch, q, k, v = make_case(MIXED, 8, 2, dtype=dtype, device="cuda")
    out, scale = run(pool, batch, q, k, v)
    tol = 1e-4 if dtype == torch.float32 else 3e-2  # TF32 / bf16 on GPU
    assert (out.double().cpu() - reference(pool, batch, q, scale)).abs().max() < tol


def test_registry() -> None:
    pool = KVPool(
        num_slots=4, num_layers=1, num_kv_heads=1, head_dim=4, dtype=torch.float32, device="cpu"
    )
    assert "torch" in available_attention_backends()
    backend = create_attention_backend("torch", pool, 0.5)
    assert isinstance(backend, TorchAttentionBackend) and backend.scale == 0.5
    with pytest.raises(ValueError, match=r"attention_backend: unknown 'nope'.*'torch'"):
        create_attention_backend("nope", pool, 0.5)


def fp8_copy(pool: KVPool) -> KVPool:
    """An FP8 pool holding `pool`'s contents, quantized (kvcache/fp8_kv.py)."""
    fp8 = KVPool(
        num_slots=pool.num_slots,
        num_layers=pool.num_layers,
        num_kv_heads=pool.num_kv_heads,
        head_dim=pool.head_dim,
        dtype=FP8,
        device=pool.device,
    )
    for layer in range(pool.num_layers):
        every_slot = torch.arange(pool.num_slots, device=pool.device)
        fp8.set_kv(layer, every_slot, pool.k_buffers[layer], pool.v_buffers[layer])
    return fp8


def dequantized(pool: KVPool) -> KVPool:
    """A float32 pool holding an FP8 pool's values as its readers see them."""
    out = KVPool(
        num_slots=pool.num_slots,
        num_layers=pool.num_layers,
        num_kv_heads=pool.num_kv_heads,
        head_dim=pool.head_dim,
        dtype=torch.float32,
        device=pool.device,
    )
    for layer in range(pool.num_layers):
        k_exp, v_exp = pool.k_scales[layer], pool.v_scales[layer]
        out.k_buffers[layer] = dequantize_kv(pool.k_buffers[layer], k_exp, torch.float32)
        out.v_buffers[layer] = dequantize_kv(pool.v_buffers[layer], v_exp, torch.float32)
    return out


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 2), (4, 4)], ids=["gqa4", "mha"])
def test_fp8_pool_reads_exactly_its_dequantized_values(num_heads: int, num_kv_heads: int) -> None:
    pool, batch, q, k, v = make_case(MIXED, num_heads, num_kv_heads, seed=5)
    exact, scale = run(pool, batch, q, k, v)
    fp8 = fp8_copy(make_case(MIXED, num_heads, num_kv_heads, seed=5)[0])
    out, _ = run(fp8, batch, q, k, v)
    assert out.dtype == torch.float32
    # The same function of the stored (quantized) K/V, new tokens included...
    assert (out.double() - reference(dequantized(fp8), batch, q, scale)).abs().max() < 1e-5
    # ...and close to attention over the unquantized K/V (e4m3: 3 mantissa bits).
    assert float((out - exact).norm() / exact.norm()) < 0.05  # measured 3.2% here
