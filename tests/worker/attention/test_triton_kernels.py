"""Triton kernels against their PyTorch references, on CPU through TRITON_INTERPRET=1 (small
sizes) or on CUDA. Fresh random inputs per case; outputs poisoned with NaN beforehand so
an unwritten element fails."""

from __future__ import annotations

from typing import TypedDict

import pytest
import torch
import triton  # a dev dependency: missing must fail, not skip
import triton.language as tl

from radixmesh.worker.attention.kernels.decode_attention import (
    DecodeConfig,
    decode_attention,
    decode_attention_ref,
    decode_config,
)
from radixmesh.worker.attention.kernels.decode_fp8_mma import _load_v_transposed
from radixmesh.worker.attention.kernels.extend_attention import (
    ExtendConfig,
    extend_attention,
    extend_attention_ref,
)
from radixmesh.worker.attention.kernels.kv_store import kv_store, kv_store_ref
from radixmesh.worker.kvcache.fp8_kv import FP8, dequantize_kv, quantize_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Blocks(TypedDict):
    config: ExtendConfig


# Interpreter-friendly blocks: small tiles, still >= 16 for tl.dot.
BLOCKS: Blocks = {"config": ExtendConfig(block_rows=16, block_n=16, num_warps=4, num_stages=2)}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# Triton 3.9's interpreter returns garbage (~1e8) from a bf16 tl.dot: bf16 attention is
# checked on the GPU only (fp16 exercises the same low-precision path here).
ATTN_DTYPES = [
    torch.float32,
    torch.float16,
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(DEVICE == "cpu", reason="interpreter's bf16 tl.dot is wrong"),
    ),
]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


class PoolCase(TypedDict):
    k_buf: torch.Tensor
    v_buf: torch.Tensor
    table: torch.Tensor
    rows: list[int]  # the table rows of the sequences, in order
    q: torch.Tensor


def make_pool_case(
    seqs: list[tuple[int, int]],
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    seed: int,
    num_slots: int = 512,
    ctx: int = 96,
) -> PoolCase:
    """Random pool contents, shuffled slots per sequence in random table rows, random q."""
    gen = torch.Generator().manual_seed(seed)
    k_buf = torch.randn(num_slots, hkv, d, generator=gen).to(DEVICE, dtype)
    v_buf = torch.randn(num_slots, hkv, d, generator=gen).to(DEVICE, dtype)
    table = torch.zeros(len(seqs) + 3, ctx, dtype=torch.int64)
    slots = (torch.randperm(num_slots - 1, generator=gen) + 1).tolist()
    rows = torch.randperm(len(seqs) + 3, generator=gen)[: len(seqs)].tolist()
    for row, (prefix, extend) in zip(rows, seqs, strict=True):
        table[row, : prefix + extend] = torch.tensor([slots.pop() for _ in range(prefix + extend)])
    t = sum(e for _, e in seqs)
    q = torch.randn(t, hq, d, generator=gen).to(DEVICE, dtype)
    return {"k_buf": k_buf, "v_buf": v_buf, "table": table.to(DEVICE), "rows": rows, "q": q}


def ints(xs: list[int]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_store_writes_exactly_the_given_slots(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    k_buf = torch.randn(64, 3, 20, generator=gen).to(DEVICE, dtype)
    v_buf = torch.randn(64, 3, 20, generator=gen).to(DEVICE, dtype)
    qkv = torch.randn(5, 4 + 3 + 3, 20, generator=gen).to(DEVICE, dtype)
    k, v = qkv[:, 4:7], qkv[:, 7:]  # strided views, as the model passes them
    loc = ints([9, 3, 60, 1, 17])
    k_ref, v_ref = k_buf.clone(), v_buf.clone()
    kv_store_ref(k_ref, v_ref, loc, k, v)
    kv_store(k_buf, v_buf, loc, k, v)
    assert torch.equal(k_buf, k_ref)
    assert torch.equal(v_buf, v_ref)


EXTEND_CASES = [
    # (seqs as (prefix, extend), Hq, Hkv, D)
    ([(0, 7), (5, 1), (12, 20), (0, 1), (40, 3), (3, 33)], 4, 2, 16),  # GQA, multi-block
    ([(17, 9), (0, 18)], 3, 3, 24),  # MHA, head_dim not a power of two
    ([(50, 1), (0, 5)], 8, 1, 32),  # MQA
    ([(4, 6), (0, 9), (21, 2)], 6, 2, 16),  # groups of 3 heads: folded as 4 rows, 1 masked
]


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
@pytest.mark.parametrize("case", range(len(EXTEND_CASES)))
def test_extend_attention_matches_reference(case: int, dtype: torch.dtype) -> None:
    seqs, hq, hkv, d = EXTEND_CASES[case]
    c = make_pool_case(seqs, hq, hkv, d, dtype, seed=100 + case)
    prefix, extend = [p for p, _ in seqs], [e for _, e in seqs]
    starts = [sum(extend[:i]) for i in range(len(seqs))]
    out = torch.full_like(c["q"], float("nan"))
    scale = d**-0.5
    extend_attention(
        c["q"], c["k_buf"], c["v_buf"], out, c["table"], ints(c["rows"]), ints(prefix),
        ints(extend), ints(starts), max(extend), scale, **BLOCKS,
    )  # fmt: skip
    ref = extend_attention_ref(
        c["q"], c["k_buf"], c["v_buf"], c["table"], c["rows"], prefix, extend, scale
    )
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[dtype]


DECODE_16 = DecodeConfig(block_n=16)

DECODE_CASES = [
    # (seq_lens, Hq, Hkv, D, num_splits)
    ([1, 37, 64, 90, 5], 8, 2, 16, 1),
    ([1, 37, 64, 90, 5], 8, 2, 16, 3),  # split 1..2 of a 1-token sequence are empty
    ([80, 33], 4, 4, 24, 7),
    ([70], 6, 1, 32, 4),
]


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
@pytest.mark.parametrize("case", range(len(DECODE_CASES)))
def test_decode_attention_matches_reference(case: int, dtype: torch.dtype) -> None:
    seq_lens, hq, hkv, d, splits = DECODE_CASES[case]
    c = make_pool_case([(n - 1, 1) for n in seq_lens], hq, hkv, d, dtype, seed=200 + case)
    out = torch.full_like(c["q"], float("nan"))
    scale = d**-0.5
    decode_attention(
        c["q"], c["k_buf"], c["v_buf"], out, c["table"], ints(c["rows"]), ints(seq_lens),
        scale, splits, config=DECODE_16,
    )  # fmt: skip
    ref = decode_attention_ref(
        c["q"], c["k_buf"], c["v_buf"], c["table"], c["rows"], seq_lens, scale
    )
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize(
    ("block_d", "elem_bytes", "max_shared", "expected"),
    [
        (128, 2, 232_448, DecodeConfig(128, 4, 3)),  # H100/H200, bf16: the swept choice
        (128, 4, 232_448, DecodeConfig(64, 4, 3)),  # float32 queries
        (256, 2, 232_448, DecodeConfig(64, 4, 3)),  # head dim 256
        (128, 2, 166_912, DecodeConfig(128, 4, 2)),  # A100
        (128, 2, 101_376, DecodeConfig(64, 4, 2)),  # consumer Ada/Ampere
        (512, 4, 101_376, DecodeConfig(32, 4, 2)),  # nothing fits: the smallest
    ],
)
def test_decode_config_fits_its_stages_in_shared_memory(
    block_d: int, elem_bytes: int, max_shared: int, expected: DecodeConfig
) -> None:
    assert decode_config(block_d, elem_bytes, max_shared) == expected


def test_decode_equals_extend_of_one_token() -> None:
    """The two kernels compute one function: decode rows through either agree in fp32."""
    seq_lens = [9, 50, 2]
    c = make_pool_case([(n - 1, 1) for n in seq_lens], 4, 2, 16, torch.float32, seed=7)
    scale = 0.25
    dec = torch.full_like(c["q"], float("nan"))
    ext = torch.full_like(c["q"], float("nan"))
    rows, lens = ints(c["rows"]), ints(seq_lens)
    decode_attention(
        c["q"], c["k_buf"], c["v_buf"], dec, c["table"], rows, lens, scale, 2,
        config=DECODE_16,
    )  # fmt: skip
    extend_attention(
        c["q"], c["k_buf"], c["v_buf"], ext, c["table"], rows, lens - 1, ints([1, 1, 1]),
        ints([0, 1, 2]), 1, scale, **BLOCKS,
    )  # fmt: skip
    torch.testing.assert_close(dec, ext, rtol=1e-5, atol=1e-6)


def fp8_pool(c: PoolCase) -> tuple[torch.Tensor, torch.Tensor, tuple, tuple]:
    """The case's pool quantized to FP8 (values, exponents) and dequantized to float32:
    the kernels read the first, the references the second (the same numbers)."""
    k8, k_exp = quantize_kv(c["k_buf"])
    v8, v_exp = quantize_kv(c["v_buf"])
    k_ref, v_ref = dequantize_kv(k8, k_exp, torch.float32), dequantize_kv(v8, v_exp, torch.float32)
    return k8, v8, (k_exp, v_exp), (k_ref, v_ref)


def decode_case(
    c: PoolCase,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: list[int],
    splits: int,
    config: DecodeConfig,
    *,
    scales: tuple | None = None,
    q: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """`decode_attention` over the case's table (its q, 1/sqrt(D) unless given), into a
    NaN-poisoned output."""
    q = c["q"] if q is None else q
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.full_like(q, float("nan"))
    return decode_attention(
        q, k, v, out, c["table"], ints(c["rows"]), ints(seq_lens), scale, splits,
        scales=scales, config=config,
    )  # fmt: skip


def test_kv_store_into_fp8_pool_matches_the_reference_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(3)
    # heads of very different magnitudes: each gets its own exponent
    magnitude = torch.tensor([1e-3] * 4 + [1, 300, 1e-4] * 2)[:, None]
    qkv = (torch.randn(6, 4 + 3 + 3, 20, generator=gen) * magnitude).to(DEVICE)
    k, v = qkv[:, 4:7], qkv[:, 7:]
    loc = ints([9, 3, 60, 1, 17, 2])
    bufs = [torch.zeros(64, 3, 20, dtype=FP8, device=DEVICE) for _ in range(4)]
    exps = [torch.zeros(64, 3, dtype=torch.int8, device=DEVICE) for _ in range(4)]
    kv_store(bufs[0], bufs[1], loc, k, v, (exps[0], exps[1]))
    kv_store_ref(bufs[2], bufs[3], loc, k, v, (exps[2], exps[3]))
    for ours, ref in ((bufs[0], bufs[2]), (bufs[1], bufs[3])):
        assert torch.equal(ours.view(torch.uint8), ref.view(torch.uint8))
    assert torch.equal(exps[0], exps[2]) and torch.equal(exps[1], exps[3])
    assert len(set(exps[0][9].tolist())) == 3  # one exponent per head: 1, 300 and 1e-4 apart
    assert not exps[0][[0, 4, 5]].any()  # untouched slots keep their zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_store_writes_the_fp8_pools_values_back_exactly(dtype: torch.dtype) -> None:
    """`write_back`: the given k/v become the pool's dequantized values, bit for bit, and the
    pool gets the bits it gets without it."""
    gen = torch.Generator().manual_seed(4)
    magnitude = torch.tensor([1e-3] * 4 + [1, 300, 1e-4] * 2)[:, None]
    qkv = (torch.randn(6, 4 + 3 + 3, 20, generator=gen) * magnitude).to(DEVICE, dtype)
    loc = ints([9, 3, 60, 1, 17, 2])
    pools = [torch.zeros(64, 3, 20, dtype=FP8, device=DEVICE) for _ in range(4)]
    exps = [torch.zeros(64, 3, dtype=torch.int8, device=DEVICE) for _ in range(4)]
    kv_store(pools[0], pools[1], loc, qkv[:, 4:7], qkv[:, 7:], (exps[0], exps[1]))
    given = qkv.clone()
    k, v = qkv[:, 4:7], qkv[:, 7:]  # strided views, as the model passes them
    kv_store(pools[2], pools[3], loc, k, v, (exps[2], exps[3]), write_back=True)
    for a, b in zip(pools[:2] + exps[:2], pools[2:] + exps[2:], strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    for x, pool, e in ((k, pools[2], exps[2]), (v, pools[3], exps[3])):
        assert torch.equal(x, dequantize_kv(pool[loc], e[loc], dtype))
    assert torch.equal(qkv[:, :4], given[:, :4])  # q's columns untouched
    assert not torch.equal(k, given[:, 4:7])  # e4m3 dropped bits: the values did change


def test_kv_store_write_back_refuses_what_it_cannot_hold_exactly() -> None:
    k = torch.randn(2, 3, 20, device=DEVICE, dtype=torch.float16)
    pool = torch.zeros(8, 3, 20, dtype=FP8, device=DEVICE)
    e = torch.zeros(8, 3, dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match=r"write_back needs .*torch.float16"):
        kv_store(pool, pool, ints([1, 2]), k, k, (e, e), write_back=True)
    k16 = torch.zeros(8, 3, 20, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="write_back needs an FP8 pool"):
        kv_store(k16, k16, ints([1, 2]), k.bfloat16(), k.bfloat16(), write_back=True)


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
@pytest.mark.parametrize("case", range(len(EXTEND_CASES)))
def test_extend_attention_over_fp8_pool_matches_reference(case: int, dtype: torch.dtype) -> None:
    seqs, hq, hkv, d = EXTEND_CASES[case]
    c = make_pool_case(seqs, hq, hkv, d, dtype, seed=300 + case)
    k8, v8, scales, (k_ref, v_ref) = fp8_pool(c)
    prefix, extend = [p for p, _ in seqs], [e for _, e in seqs]
    starts = [sum(extend[:i]) for i in range(len(seqs))]
    out = torch.full_like(c["q"], float("nan"))
    scale = d**-0.5
    extend_attention(
        c["q"], k8, v8, out, c["table"], ints(c["rows"]), ints(prefix), ints(extend),
        ints(starts), max(extend), scale, scales=scales, **BLOCKS,
    )  # fmt: skip
    ref = extend_attention_ref(c["q"], k_ref, v_ref, c["table"], c["rows"], prefix, extend, scale)
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
@pytest.mark.parametrize("case", range(len(DECODE_CASES)))
def test_decode_attention_over_fp8_pool_matches_reference(case: int, dtype: torch.dtype) -> None:
    seq_lens, hq, hkv, d, splits = DECODE_CASES[case]
    c = make_pool_case([(n - 1, 1) for n in seq_lens], hq, hkv, d, dtype, seed=400 + case)
    k8, v8, scales, (k_ref, v_ref) = fp8_pool(c)
    out = torch.full_like(c["q"], float("nan"))
    scale = d**-0.5
    decode_attention(
        c["q"], k8, v8, out, c["table"], ints(c["rows"]), ints(seq_lens), scale, splits,
        scales=scales, config=DECODE_16,
    )  # fmt: skip
    ref = decode_attention_ref(c["q"], k_ref, v_ref, c["table"], c["rows"], seq_lens, scale)
    assert not out.isnan().any()
    assert rel_err(out, ref) < TOL[dtype]


def test_decode_over_fp8_pool_is_decode_over_its_dequantized_values_bit_for_bit() -> None:
    """Float32 queries: the kernel folds each key's 2^e into its score and its weight
    instead of scaling K and V: the same products, scaled by powers of two, so the same
    bits as decoding a pool that holds the dequantized values."""
    seq_lens, hq, hkv, d, splits = DECODE_CASES[1]
    c = make_pool_case([(n - 1, 1) for n in seq_lens], hq, hkv, d, torch.float32, seed=431)
    k8, v8, scales, (k_ref, v_ref) = fp8_pool(c)
    fp8 = decode_case(c, k8, v8, seq_lens, splits, DECODE_16, scales=scales)
    assert torch.equal(fp8, decode_case(c, k_ref, v_ref, seq_lens, splits, DECODE_16))


@pytest.mark.parametrize("dtype", [torch.float16, ATTN_DTYPES[2]])
def test_decode_over_fp8_pool_with_16_bit_queries_is_fp16_exact(dtype: torch.dtype) -> None:
    """16-bit queries over an FP8 pool multiply in fp16 (e4m3 values are exact there, the
    query and weights are shifted into its range by powers of two): as close to the
    float32 reference as fp16 operands allow, for bf16 queries too (bf16 weights: 1e-2)."""
    seq_lens, hq, hkv, d, splits = DECODE_CASES[1]
    c = make_pool_case([(n - 1, 1) for n in seq_lens], hq, hkv, d, dtype, seed=433)
    k8, v8, scales, (k_ref, v_ref) = spread_fp8_pool(c, 9)
    out = decode_case(c, k8, v8, seq_lens, splits, DECODE_16, scales=scales)
    ref = decode_attention_ref(c["q"], k_ref, v_ref, c["table"], c["rows"], seq_lens, d**-0.5)
    assert rel_err(out, ref) < TOL[torch.float16]


# The FP8 matrix-unit path quantizes the query and the softmax weights to e4m3 (3 mantissa
# bits; two terms each: ~7): 1-6% relative error on random data with one term, where the
# conversion path is fp16-exact. On the GPU a 32-key tile runs as mma.sync after an
# upcast; the engine's 64- and 128-key tiles are wgmma (test_decode_fp8_mma_on_engine_tiles).
FP8_MMA_32 = DecodeConfig(block_n=32, fp8_mma=True)
FP8_MMA_TOL = 3e-2
# e4m3 products take K >= 32 on the GPU: head dims >= 32 (48: padded to 64 and transposed
# by the compiler; 32 and 64: in registers).
MMA_CASES = [
    # (seq_lens, Hq, Hkv, D, num_splits)
    ([1, 37, 64, 90, 5], 8, 2, 32, 1),
    ([1, 37, 64, 90, 5], 8, 2, 32, 3),
    ([80, 33], 4, 4, 48, 2),
    ([70], 6, 1, 64, 4),
]


def spread_fp8_pool(c: PoolCase, seed: int) -> tuple[torch.Tensor, torch.Tensor, tuple, tuple]:
    """`fp8_pool` of a pool whose tokens' values differ in magnitude by up to 2^8 either
    way (keys by 2 either way: larger spreads make scores whose rounding no 16-bit query
    survives either), so that the keys of one tile carry different exponents."""
    gen = torch.Generator().manual_seed(seed)
    n = c["k_buf"].shape[0]
    for name, e in (("k_buf", 1), ("v_buf", 8)):
        spread = torch.pow(2.0, torch.randint(-e, e + 1, (n, 1, 1), generator=gen).float())
        c[name] = c[name] * spread.to(c[name].device, c[name].dtype)  # type: ignore[literal-required]
    return fp8_pool(c)


@pytest.mark.parametrize("spread", [False, True])
@pytest.mark.parametrize("dtype", ATTN_DTYPES)
@pytest.mark.parametrize("case", range(len(MMA_CASES)))
def test_decode_fp8_mma_matches_reference(case: int, dtype: torch.dtype, spread: bool) -> None:
    seq_lens, hq, hkv, d, splits = MMA_CASES[case]
    c = make_pool_case([(n - 1, 1) for n in seq_lens], hq, hkv, d, dtype, seed=500 + case)
    k8, v8, scales, (k_ref, v_ref) = spread_fp8_pool(c, 7) if spread else fp8_pool(c)
    out = decode_case(c, k8, v8, seq_lens, splits, FP8_MMA_32, scales=scales)
    ref = decode_attention_ref(c["q"], k_ref, v_ref, c["table"], c["rows"], seq_lens, d**-0.5)
    assert not out.isnan().any()
    err = rel_err(out, ref)
    assert err < FP8_MMA_TOL
    # Not the exact path by accident: quantizing q and the weights moves the result.
    assert err > TOL[dtype] / 10


def test_decode_fp8_mma_output_is_invariant_to_the_query_scale() -> None:
    """Each head's query is scaled by a power of two into e4m3's range, and the scale comes
    back exactly: 2^10 q gives the scores of q times 2^10 (the same e4m3 digits) -- the
    same output as 2^10 times softmax's temperature, computed from q at the scale 2^10."""
    seq_lens, hq, hkv, d, splits = MMA_CASES[2]
    c = make_pool_case([(n - 1, 1) for n in seq_lens], hq, hkv, d, torch.float32, seed=521)
    k8, v8, scales, _ = fp8_pool(c)

    def run(q: torch.Tensor, scale: float) -> torch.Tensor:
        return decode_case(c, k8, v8, seq_lens, splits, FP8_MMA_32, scales=scales, q=q, scale=scale)

    small = run(c["q"] * 2.0**-10, d**-0.5 * 2.0**10)
    assert torch.equal(small, run(c["q"], d**-0.5))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu", reason="wgmma tiles: the GPU's compiler")
@pytest.mark.parametrize("block_n", [64, 128])
def test_decode_fp8_mma_on_engine_tiles(block_n: int) -> None:
    """The engine's launch on Llama-3-8B's heads: the e4m3 wgmma path against the
    reference, beside the conversion path on the same pool."""
    seq_lens = [1, 200, 777, 1500]
    c = make_pool_case([(n - 1, 1) for n in seq_lens], 32, 8, 128, torch.bfloat16, 540, 4096, 1600)
    k8, v8, scales, (k_ref, v_ref) = fp8_pool(c)
    scale = 128**-0.5
    ref = decode_attention_ref(c["q"], k_ref, v_ref, c["table"], c["rows"], seq_lens, scale)
    errs = []
    for cfg in (DecodeConfig(block_n, 4, 3, fp8_mma=True), DecodeConfig(128, 4, 3)):
        out = decode_case(c, k8, v8, seq_lens, 4, cfg, scales=scales)
        assert not out.isnan().any()
        errs.append(rel_err(out, ref))
    assert errs[0] < FP8_MMA_TOL and errs[1] < TOL[torch.bfloat16]


@triton.jit
def _transpose_probe(
    V_words,
    Out,
    slots_ptr,
    kv_head,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PTX: tl.constexpr,
):
    offs_n = tl.arange(0, BLOCK_N)
    slots = tl.load(slots_ptr + offs_n).to(tl.int64)
    vt = _load_v_transposed(
        V_words, slots, offs_n < BLOCK_N, kv_head, 2 * BLOCK_D, BLOCK_D, BLOCK_N, BLOCK_D, PTX
    )
    offs_d = tl.arange(0, BLOCK_D)
    tl.store(Out + offs_d[:, None] * BLOCK_N + offs_n[None, :], vt.to(tl.uint8, bitcast=True))


@pytest.mark.parametrize("block_n,block_d", [(16, 16), (64, 128)])
def test_fp8_value_tile_transposes_in_registers_exactly(block_n: int, block_d: int) -> None:
    """The FP8 path's V tile, gathered through shuffled slots of head 1 of 2 and transposed
    4 x 4 bytes at a time (PTX byte permutes on the GPU, shifts in the interpreter), holds
    exactly the pool's bytes at [dim, key]."""
    gen = torch.Generator().manual_seed(11)
    pool = torch.randint(0, 256, (3 * block_n, 2, block_d), dtype=torch.uint8, generator=gen)
    slots = torch.randperm(3 * block_n, generator=gen)[:block_n]
    out = torch.zeros(block_d, block_n, dtype=torch.uint8, device=DEVICE)
    pool, slots = pool.to(DEVICE), slots.to(DEVICE)
    on_gpu = DEVICE == "cuda"
    _transpose_probe[(1,)](
        pool.view(torch.int32), out, slots, 1, BLOCK_N=block_n, BLOCK_D=block_d, PTX=on_gpu
    )
    assert torch.equal(out, pool[slots, 1, :].T)
