"""The triton backend against the float64 reference over the slot table: mixed, decode-only
and extend-only batches (CPU through TRITON_INTERPRET=1, or CUDA)."""

from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: missing must fail, not skip)

from radixmesh.worker.attention.registry import create_attention_backend
from radixmesh.worker.attention.triton_backend import (
    DecodeMeta,
    ExtendMeta,
    MixedMeta,
    SharedPrefixMeta,
    TritonAttentionBackend,
    choose_num_splits,
    choose_prefix_splits,
)
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.kvcache.pool import KVPool, kv_storage_dtype
from radixmesh.worker.model import dummy
from radixmesh.worker.model.llama import LlamaForCausalLM
from tests.worker.attention.test_torch_backend import (
    HEAD_DIM,
    LAYER,
    MIXED,
    NUM_SLOTS,
    dequantized,
    fp8_copy,
    make_case,
    reference,
)
from tests.worker.model.helpers import RaggedRunner

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "seqs",
    [
        MIXED,
        [(10, 1), (0, 1), (33, 1), (7, 1)],
        [(14, 1), (14, 1), (14, 1)],
        [(0, 12)],
        [(9, 5), (0, 3)],
        [(20, 1), (31, 1), (15, 9), (4, 1), (40, 1)],
    ],
    ids=[
        "mixed",
        "decode-only",
        "decode-equal-lengths",
        "one-prompt",
        "extends-only",
        "forced-tokens-beside-decodes",
    ],
)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 2), (4, 4)], ids=["gqa4", "mha"])
def test_matches_reference(seqs: list[tuple[int, int]], num_heads: int, num_kv_heads: int) -> None:
    pool, batch, q, k, v = make_case(seqs, num_heads, num_kv_heads, device=DEVICE)
    scale = HEAD_DIM**-0.5
    backend = create_attention_backend("triton", pool, scale)
    assert isinstance(backend, TritonAttentionBackend)
    backend.prepare(batch)
    decode_rows = sum(e == 1 for _, e in seqs)
    kind = {len(seqs): DecodeMeta, 0: ExtendMeta}.get(decode_rows, MixedMeta)
    assert type(batch.attn_metadata) is kind
    before = [buf.clone() for buf in pool.k_buffers + pool.v_buffers]
    out = backend.forward(q, k, v, LAYER, batch)
    out_again = backend.forward(q, k, v, LAYER, batch)  # a second layer reuses the metadata
    assert out.shape == q.shape and out.dtype == q.dtype
    err = (out.double().cpu() - reference(pool, batch, q, scale)).abs().max()
    assert err < (1e-4 if DEVICE == "cuda" else 1e-5)  # fp32: exact products on both
    assert torch.equal(out, out_again)
    # The new k/v landed in their slots of this layer and nowhere else.
    loc = batch.out_cache_loc
    assert torch.equal(pool.k_buffers[LAYER][loc], k) and torch.equal(pool.v_buffers[LAYER][loc], v)
    untouched = torch.ones(NUM_SLOTS, dtype=torch.bool, device=DEVICE)
    untouched[loc] = False
    assert torch.equal(pool.k_buffers[LAYER][untouched], before[LAYER][untouched])
    assert torch.equal(pool.k_buffers[0], before[0]) and torch.equal(pool.v_buffers[0], before[2])


def test_num_splits_fill_the_gpu_but_stay_long() -> None:
    # 132 SMs, 16 waves = 2112 programs wanted.
    assert choose_num_splits(1, 8, 100_000, 132) == 32  # 264 wanted, capped at 32
    assert choose_num_splits(1, 8, 1000, 132) == 4  # 1000 keys: no split under 256 keys
    assert choose_num_splits(256, 8, 4096, 132) == 2  # 2048 programs: 2 splits
    assert choose_num_splits(512, 8, 4096, 132) == 1
    assert choose_num_splits(8, 8, 4096, 132) == 16  # by length: 4096 / 256
    assert choose_num_splits(3, 2, 1, 132) == 1


def test_prefix_splits_fill_one_wave() -> None:
    assert choose_prefix_splits(16, 8, 1536, 132) == 1  # 128 programs: one wave already
    assert choose_prefix_splits(2, 8, 1536, 132) == 6  # 8 would fill it; 1,536 keys: 6
    assert choose_prefix_splits(2, 8, 100_000, 132) == 8
    assert choose_prefix_splits(1, 1, 100_000, 132) == 32  # capped
    assert choose_prefix_splits(100, 8, 1536, 132) == 1


@pytest.mark.parametrize("seqs", [MIXED, [(10, 1), (0, 1), (33, 1)], [(9, 5), (0, 3)]],
                         ids=["mixed", "decode-only", "extends-only"])  # fmt: skip
def test_fp8_pool_matches_reference_over_its_dequantized_values(
    seqs: list[tuple[int, int]],
) -> None:
    pool, batch, q, k, v = make_case(seqs, 8, 2, device=DEVICE)
    fp8 = fp8_copy(pool)
    scale = HEAD_DIM**-0.5
    backend = create_attention_backend("triton", fp8, scale)
    backend.prepare(batch)
    given_k, given_v = k.clone(), v.clone()
    out = backend.forward(q, k, v, LAYER, batch)  # stores the new k/v quantized, then reads
    err = (out.double().cpu() - reference(dequantized(fp8), batch, q, scale)).abs().max()
    assert err < (1e-4 if DEVICE == "cuda" else 1e-5)
    # The store kernel wrote what the torch backend's store writes.
    ref_pool = fp8_copy(pool)
    ref_pool.set_kv(LAYER, batch.out_cache_loc, given_k, given_v)
    # Steps with new tokens got the pool's values written back into k/v; decode steps not.
    held = dequantized(ref_pool)
    written_back = any(e > 1 for _, e in seqs)
    for x, given, bufs in ((k, given_k, held.k_buffers), (v, given_v, held.v_buffers)):
        pooled = bufs[LAYER][batch.out_cache_loc].to(x.dtype)
        assert torch.equal(x, pooled if written_back else given)
    for ours, theirs in ((fp8.k_buffers, ref_pool.k_buffers), (fp8.k_scales, ref_pool.k_scales)):
        assert torch.equal(ours[LAYER].view(torch.uint8), theirs[LAYER].view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_cuda_fp8_model_triton_matches_torch_backend(kv_cache_dtype: str) -> None:
    """A bf16 model with FP8 weights (torch._scaled_mm) over each backend's pool: the
    triton kernels (store, extend, decode, FP8 or not) give the torch backend's logits."""
    arch = dummy.preset_arch("tiny")
    model = LlamaForCausalLM(arch, dtype=torch.bfloat16, device="cuda", quantization="fp8")
    model.load_weights(dummy.iter_dummy_weights(arch, dtype=torch.bfloat16, device="cuda", seed=0))
    kv_dtype = kv_storage_dtype(kv_cache_dtype, torch.bfloat16)
    logits = {}
    for backend in ("torch", "triton"):
        runner = RaggedRunner(model, backend=backend, kv_dtype=kv_dtype)
        first = runner.step([(0, list(range(5, 40))), (1, list(range(60, 67)))])
        decode = runner.step([(0, [41]), (1, [70])])  # decode rows over the stored KV
        logits[backend] = torch.cat([x for step in (first, decode) for x in step]).float()
    err = (logits["triton"] - logits["torch"]).norm() / logits["torch"].norm()
    assert float(err) < 3e-2  # bfloat16 attention in two implementations, two layers


def shared_prefix_case(seed: int) -> tuple[KVPool, ForwardBatch, torch.Tensor, torch.Tensor]:
    """A decode batch of 9 rows: 6 hold the same slots for a 30-token prefix (then 1-5
    tokens of their own), 3 share nothing; every key's KV already in the pool."""
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(
        num_slots=NUM_SLOTS, num_layers=2, num_kv_heads=2, head_dim=HEAD_DIM,
        dtype=torch.float32, device=DEVICE,
    )  # fmt: skip
    for buf in (pool.k_buffers[LAYER], pool.v_buffers[LAYER]):
        buf.copy_(torch.randn(buf.shape, generator=gen))
    free = (torch.randperm(NUM_SLOTS - 1, generator=gen) + 1).tolist()
    shared = [free.pop() for _ in range(30)]
    table = torch.zeros(16, 64, dtype=torch.int64)
    rows = torch.randperm(16, generator=gen)[:9].tolist()
    lens = []
    for i, row in enumerate(rows):
        own = [free.pop() for _ in range(1 + i % 5)]
        slots = (shared if i % 3 else [free.pop() for _ in range(20)]) + own
        table[row, : len(slots)] = torch.tensor(slots)
        lens.append(len(slots))
    batch = ForwardBatch.build(
        input_ids=[0] * 9,
        out_cache_loc=torch.tensor([int(table[r, n - 1]) for r, n in zip(rows, lens, strict=True)]),
        req_rows=rows,
        prefix_lens=[n - 1 for n in lens],
        extend_lens=[1] * 9,
        req_to_token=table.to(DEVICE),
    )
    batch.req_to_token_host = table.numpy()
    q = torch.randn(9, 8, HEAD_DIM, generator=gen).to(DEVICE)
    # The new tokens' k/v as the pool already holds them: the store rewrites the same values.
    new = batch.out_cache_loc
    return pool, batch, q, pool.k_buffers[LAYER][new].clone()


@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_shared_prefix_decode_matches_the_reference_and_runs_eagerly(fused: bool) -> None:
    pool, batch, q, k = shared_prefix_case(seed=3)
    v = pool.v_buffers[LAYER][batch.out_cache_loc].clone()
    scale = HEAD_DIM**-0.5
    backend = create_attention_backend("triton", pool, scale)
    assert isinstance(backend, TritonAttentionBackend) and not backend.shared_prefix  # off
    assert backend.graph_can_run(batch, 16)
    backend.shared_prefix = True
    backend.shared_fused = fused
    # A graph captured without the shared-prefix launches (they were off then) cannot.
    assert not backend.graph_can_run(batch, 16)
    backend.prepare(batch)
    meta = batch.attn_metadata
    assert isinstance(meta, SharedPrefixMeta) and backend.num_shared_prefix_steps == 1
    out = backend.forward(q, k, v, LAYER, batch)
    # 6 rows in one chunk; fused, the 3 others in chunks of their own too.
    assert meta.chunks is not None and meta.chunks.offsets.numel() == (5 if fused else 2)
    assert meta.fused == fused
    assert (out.double().cpu() - reference(pool, batch, q, scale)).abs().max() < 1e-5
    again = backend.forward(q, k, v, LAYER, batch)  # the next layer reuses the chunks
    assert torch.equal(again, out)
    flat = create_attention_backend("triton", pool, scale)
    flat.prepare(batch)
    assert isinstance(batch.attn_metadata, DecodeMeta)
    assert (flat.forward(q, k, v, LAYER, batch) - out).abs().max() < 1e-5


def padded(batch: ForwardBatch, q: torch.Tensor, bs: int) -> tuple[ForwardBatch, torch.Tensor]:
    """`batch` padded to `bs` rows as a decode graph's static batch is: token 0 into the
    reserved slot 0, table row 0, one key."""
    pad = bs - batch.batch_size
    static = ForwardBatch.build(
        input_ids=[0] * bs,
        out_cache_loc=torch.cat([batch.out_cache_loc.cpu(), torch.zeros(pad, dtype=torch.int64)]),
        req_rows=[*batch.req_rows.tolist(), *[0] * pad],
        prefix_lens=[*batch.prefix_lens_cpu, *[0] * pad],
        extend_lens=[1] * bs,
        req_to_token=batch.req_to_token,
    )
    return static, torch.cat([q, q.new_ones(pad, *q.shape[1:])])


@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_shared_prefix_graph_metadata_repacked_before_each_replay(fused: bool) -> None:
    """A decode graph's shared-prefix launches (`graph_metadata` variant 1 at 16 rows),
    their chunks packed by `before_replay` for each step: the reference's outputs for a
    batch that shares a prefix, and for one that shares nothing (no chunks: the flat
    kernel's work; `graph_variant` sends such a step to the flat graph), through the same
    buffers. Fused: the one-launch kernel, every row in a chunk."""
    pool, batch, q, k = shared_prefix_case(seed=3)
    v = pool.v_buffers[LAYER][batch.out_cache_loc].clone()
    scale = HEAD_DIM**-0.5
    backend = create_attention_backend("triton", pool, scale)
    assert isinstance(backend, TritonAttentionBackend)
    backend.shared_prefix = True
    backend.shared_fused = fused
    assert backend.graph_variants(16) == 2 and backend.graph_variants(4) == 1  # MIN_ROWS
    assert isinstance(backend.graph_metadata(16, 64, q.shape[1], 0), DecodeMeta)
    meta = backend.graph_metadata(16, 64, q.shape[1], 1)
    assert isinstance(meta, SharedPrefixMeta) and meta.chunks is not None
    assert meta.fused == fused and (meta.workspace is None) == fused
    assert backend.graph_can_run(batch, 16) and not backend.graph_can_run(batch, 32)
    assert backend.graph_variant(batch, 16) == 1
    static, q16 = padded(batch, q, 16)
    static.attn_metadata = meta
    k16, v16 = (torch.cat([x, pool.k_buffers[LAYER][:1].expand(7, -1, -1)]) for x in (k, v))
    packed = meta.chunks.packed.data_ptr()
    backend.before_replay(static, batch, 7)
    assert meta.chunks.counts.tolist()[0] >= 1 and backend.num_shared_prefix_steps == 1
    out = backend.forward(q16, k16, v16, LAYER, static)[:9]
    ref = reference(pool, batch, q, scale)
    assert (out.double().cpu() - ref).abs().max() < 1e-5
    # A step whose rows share nothing: the table's rows reordered so none share a prefix.
    lone = torch.zeros_like(batch.req_to_token.cpu())
    free = iter(range(1, NUM_SLOTS))
    for r, n in zip(batch.req_rows.tolist(), batch.seq_lens_cpu, strict=True):
        lone[r, :n] = torch.tensor([next(free) for _ in range(n)])
    other = ForwardBatch.build(
        input_ids=[0] * 9,
        out_cache_loc=lone.cpu()[batch.req_rows.cpu(), torch.tensor(batch.seq_lens_cpu) - 1],
        req_rows=batch.req_rows.tolist(), prefix_lens=batch.prefix_lens_cpu, extend_lens=[1] * 9,
        req_to_token=lone.to(DEVICE),
    )  # fmt: skip
    other.req_to_token_host = lone.numpy()
    static.req_to_token.copy_(lone)
    assert backend.graph_variant(other, 16) == 0  # the flat graph's step
    backend.before_replay(static, other, 7)  # were it replayed here: no chunks
    in_use = meta.chunks.counts.tolist()[0]
    assert in_use == (9 if fused else 0) and meta.chunks.packed.data_ptr() == packed
    assert backend.num_shared_prefix_steps == 1
    loc = other.out_cache_loc
    k_o, v_o = pool.k_buffers[LAYER][loc], pool.v_buffers[LAYER][loc]
    static.out_cache_loc[:9].copy_(other.out_cache_loc)
    pad = pool.k_buffers[LAYER][:1].expand(7, -1, -1)
    got = backend.forward(q16, torch.cat([k_o, pad]), torch.cat([v_o, pad]), LAYER, static)[:9]
    assert (got.double().cpu() - reference(pool, other, q, scale)).abs().max() < 1e-5
