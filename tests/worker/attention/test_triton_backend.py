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
    TritonAttentionBackend,
    choose_num_splits,
)
from radixmesh.worker.kvcache.pool import kv_storage_dtype
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
