"""The extend kernel's key ranges (prefix through the table, new tokens off and on the
diagonal) and key sources (this forward's k/v or the pool) against the float32 PyTorch
reference, in float32 (CPU through TRITON_INTERPRET=1, or CUDA). Small tiles so that
short sequences still cross every boundary: prefix tails, diagonal tiles wider and
narrower than a program's tokens, extends that are not multiples of either."""

from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: missing must fail, not skip)

from radixmesh.worker.attention.kernels.extend_attention import (
    LONG_EXTEND,
    ExtendConfig,
    extend_attention,
    extend_attention_ref,
    extend_config,
)
from radixmesh.worker.attention.kernels.kv_store import kv_store
from tests.worker.attention.test_triton_kernels import (
    ATTN_DTYPES,
    DEVICE,
    PoolCase,
    fp8_pool,
    ints,
    make_pool_case,
    rel_err,
)

TOL = 1e-5  # float32 through the IEEE dot path

# (name, seqs as (prefix, extend), Hq, Hkv, D, block_rows, block_n)
CASES = [
    ("long-no-prefix", [(0, 75)], 2, 2, 16, 32, 16),  # 3 programs' tokens, 2 diagonal tiles
    ("prefix-and-extend", [(37, 29), (64, 16), (5, 40)], 4, 4, 16, 16, 16),  # group 1
    ("ragged", [(0, 1), (3, 17), (16, 33), (0, 2)], 6, 2, 24, 16, 16),  # group 3, D padded
    ("group-4-narrow-diagonal", [(9, 30), (0, 21)], 8, 2, 16, 16, 32),  # 4 tokens, 32-key tiles
    ("group-8", [(20, 13), (0, 26)], 8, 1, 16, 32, 16),  # MQA: 4 tokens x 8 heads a program
]


def fresh_kv(
    c: PoolCase, seqs: list[tuple[int, int]], hq: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This forward's k/v as the model hands them over, holding the pool's contents at each
    new token's slot: k a view [T, Hkv, D] of the rotated [T, Hq + Hkv, D] q/k tensor, v
    one of the fused [T, Hq + 2 Hkv, D] projection (so their row strides differ)."""
    hkv, d = c["k_buf"].shape[1:]
    t = sum(e for _, e in seqs)
    qk = torch.full((t, hq + hkv, d), float("nan"), dtype=c["k_buf"].dtype, device=DEVICE)
    qkv = torch.full((t, hq + 2 * hkv, d), float("nan"), dtype=c["k_buf"].dtype, device=DEVICE)
    at = 0
    for row, (prefix, extend) in zip(c["rows"], seqs, strict=True):
        slots = c["table"][row, prefix : prefix + extend]
        qk[at : at + extend, hq:] = c["k_buf"][slots]
        qkv[at : at + extend, hq + hkv :] = c["v_buf"][slots]
        at += extend
    return qk[:, hq:], qkv[:, hq + hkv :]


def without_new_tokens(c: PoolCase, seqs: list[tuple[int, int]], buf: torch.Tensor) -> torch.Tensor:
    """A copy of the pool with the new tokens' slots NaN: a kernel that reads them there
    instead of from the fresh k/v fails."""
    buf = buf.clone()
    for row, (prefix, extend) in zip(c["rows"], seqs, strict=True):
        buf[c["table"][row, prefix : prefix + extend]] = float("nan")
    return buf


def run(
    c: PoolCase,
    seqs: list[tuple[int, int]],
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    config: ExtendConfig | None,
    **kwargs: object,
) -> torch.Tensor:
    prefix, extend = [p for p, _ in seqs], [e for _, e in seqs]
    starts = [sum(extend[:i]) for i in range(len(seqs))]
    out = torch.full_like(c["q"], float("nan"))
    d = c["q"].shape[2]
    extend_attention(
        c["q"], k_buf, v_buf, out, c["table"], ints(c["rows"]), ints(prefix), ints(extend),
        ints(starts), max(extend), d**-0.5, config=config, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    assert not out.isnan().any()
    return out


def reference(
    c: PoolCase, seqs: list[tuple[int, int]], k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    prefix, extend = [p for p, _ in seqs], [e for _, e in seqs]
    d = c["q"].shape[2]
    return extend_attention_ref(c["q"], k, v, c["table"], c["rows"], prefix, extend, d**-0.5)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fresh_and_pooled_keys_match_the_reference_bit_for_bit_alike(case: tuple) -> None:
    """Both key sources give the reference's numbers, and the very same bits as each other
    (same keys, same order of operations): the fresh path reads only the fresh k/v for the
    new tokens (their pool slots are NaN there), the pooled path only the pool."""
    _, seqs, hq, hkv, d, rows, block_n = case
    c = make_pool_case(seqs, hq, hkv, d, torch.float32, seed=500 + len(seqs), ctx=128)
    cfg = ExtendConfig(block_rows=rows, block_n=block_n, num_warps=4, num_stages=2)
    pooled = run(c, seqs, c["k_buf"], c["v_buf"], cfg)
    k_old, v_old = (without_new_tokens(c, seqs, buf) for buf in (c["k_buf"], c["v_buf"]))
    fresh = run(c, seqs, k_old, v_old, cfg, new_kv=fresh_kv(c, seqs, hq))
    assert rel_err(pooled, reference(c, seqs, c["k_buf"], c["v_buf"])) < TOL
    assert torch.equal(pooled, fresh)


def test_fp8_pool_reads_every_key_through_the_table() -> None:
    seqs = [(21, 19), (0, 35), (48, 3)]
    hq, hkv, d = 8, 2, 16
    c = make_pool_case(seqs, hq, hkv, d, torch.float32, seed=600, ctx=128)
    k8, v8, scales, (k_ref, v_ref) = fp8_pool(c)
    cfg = ExtendConfig(block_rows=16, block_n=16, num_warps=4, num_stages=2)
    out = run(c, seqs, k8, v8, cfg, scales=scales)
    assert rel_err(out, reference(c, seqs, k_ref, v_ref)) < TOL


def new_slots(c: PoolCase, seqs: list[tuple[int, int]]) -> torch.Tensor:
    """The new tokens' slots, in q's row order."""
    return torch.cat(
        [c["table"][row, p : p + e] for row, (p, e) in zip(c["rows"], seqs, strict=True)]
    )


# bfloat16 on the GPU only: the interpreter's bf16 tl.dot is wrong (test_triton_kernels).
WRITE_BACK_DTYPES = [t for t in ATTN_DTYPES if getattr(t, "values", (t,))[0] != torch.float16]


@pytest.mark.parametrize("dtype", WRITE_BACK_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fp8_pool_new_tokens_written_back_give_the_tables_bits(
    case: tuple, dtype: torch.dtype
) -> None:
    """Over an FP8 pool, the new tokens read from this forward's k/v once the store wrote
    the pool's values back into them (their slots hold e4m3 NaNs there) give the bits of
    reading every key through the table."""
    _, seqs, hq, hkv, d, rows, block_n = case
    c = make_pool_case(seqs, hq, hkv, d, dtype, seed=800 + len(seqs), ctx=128)
    cfg = ExtendConfig(block_rows=rows, block_n=block_n, num_warps=4, num_stages=2)
    k8, v8, scales, (k_ref, v_ref) = fp8_pool(c)  # the prefixes' (and all) keys quantized
    k_new, v_new = fresh_kv(c, seqs, hq)  # the new tokens' unquantized k/v
    loc = new_slots(c, seqs)
    kv_store(k8, v8, loc, k_new, v_new, scales, write_back=True)
    pooled = run(c, seqs, k8, v8, cfg, scales=scales)
    for buf in (k8, v8):
        buf.view(torch.uint8)[loc] = 0x7F  # e4m3 NaN: the fresh path must not read these
    fresh = run(c, seqs, k8, v8, cfg, scales=scales, new_kv=(k_new, v_new))
    assert torch.equal(pooled, fresh)
    tol = TOL if dtype == torch.float32 else 1e-2
    assert rel_err(pooled, reference(c, seqs, k_ref, v_ref)) < tol


def test_default_tiles_for_a_long_extend_over_a_prefix() -> None:
    """The long-extend config (128 folded rows, 64-key tiles), given explicitly: an extend
    of LONG_EXTEND tokens is too slow for the interpreter."""
    seqs = [(70, 261)]
    hq, hkv, d = 4, 1, 16
    c = make_pool_case(seqs, hq, hkv, d, torch.float32, seed=700, num_slots=400, ctx=400)
    cfg = extend_config(LONG_EXTEND, d)
    out = run(c, seqs, c["k_buf"], c["v_buf"], cfg, new_kv=fresh_kv(c, seqs, hq))
    assert rel_err(out, reference(c, seqs, c["k_buf"], c["v_buf"])) < TOL


def test_config_table_keys_on_extend_length_and_head_dim() -> None:
    short = extend_config(LONG_EXTEND - 1, 128)
    long = extend_config(LONG_EXTEND, 128)
    assert short == ExtendConfig(block_rows=128, block_n=32, num_warps=4, num_stages=3)
    assert long == ExtendConfig(block_rows=128, block_n=64, num_warps=8, num_stages=3)
    assert extend_config(8192, 256).block_n == 32


F16_PREFIX_DTYPES = [t for t in ATTN_DTYPES if getattr(t, "values", (t,))[0] != torch.float32]


@pytest.mark.parametrize("dtype", F16_PREFIX_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fp8_prefix_in_fp16_matches_the_reference(case: tuple, dtype: torch.dtype) -> None:
    """`fp16_prefix`: the cached prefix's e4m3 tiles multiplied as fp16 beside a query
    shifted per row, the weights shifted per row for P.V: the reference's numbers over the
    pool's dequantized values, to fp16's rounding (queries large enough that unshifted
    scores would leave fp16's comfortable range)."""
    _, seqs, hq, hkv, d, rows, block_n = case
    c = make_pool_case(seqs, hq, hkv, d, dtype, seed=900 + len(seqs), ctx=128)
    c["q"] = c["q"] * 40.0  # queries past fp16's comfortable range: the shift must hold
    cfg = ExtendConfig(block_rows=rows, block_n=block_n, num_warps=4, num_stages=2)
    k8, v8, scales, (k_ref, v_ref) = fp8_pool(c)
    out = run(c, seqs, k8, v8, cfg, scales=scales, fp16_prefix=True)
    plain = run(c, seqs, k8, v8, cfg, scales=scales, fp16_prefix=False)
    ref = reference(c, seqs, k_ref, v_ref)
    assert rel_err(out, ref) < (2e-3 if dtype == torch.float16 else 1e-2)
    if dtype == torch.float16:
        # The shifts are powers of two on exact operands: the bits of the plain fp16 path
        # (e4m3 keys converted to the query's dtype, the values' 2^e on them).
        assert torch.equal(out, plain)


def test_fp16_prefix_is_refused_where_it_cannot_apply() -> None:
    seqs = [(5, 3)]
    c = make_pool_case(seqs, 2, 1, 16, torch.float32, seed=1, ctx=128)
    cfg = ExtendConfig(block_rows=16, block_n=16, num_warps=4, num_stages=2)
    k8, v8, scales, _ = fp8_pool(c)
    with pytest.raises(ValueError, match="fp16_prefix needs"):
        run(c, seqs, k8, v8, cfg, scales=scales, fp16_prefix=True)  # float32 queries
    with pytest.raises(ValueError, match="fp16_prefix needs"):
        run(c, seqs, c["k_buf"], c["v_buf"], cfg, fp16_prefix=True)  # no FP8 pool
