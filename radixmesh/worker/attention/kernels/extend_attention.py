"""Extend attention: a ragged batch of new tokens over their cached prefix plus themselves.

Sequence b has `extend_lens[b]` new tokens at rows `q_start[b] ..` of q, at positions
`prefix_lens[b] + i`; new token i sees keys 0 .. prefix + i. The new tokens' k/v are
already stored in the pool (through the slot table `req_to_token[req_rows[b]]`) when
this runs.

One program per (sequence, KV head, block of new tokens) runs an online softmax (base 2:
the scale is pre-multiplied by log2 e) over three key ranges, so that only the keys that
can be masked pay for the mask:

1. the cached prefix, read through the slot table: every new token sees all of it, so its
   full BLOCK_N tiles run unmasked and only its last partial tile is bounds-masked;
2. the new tokens before the block's first token (off the diagonal): seen by every row,
   unmasked;
3. the diagonal: the new tokens from the block's first token (rounded down to a tile) to
   its last, causally masked. Key tiles past the block's last token are never visited.

The new tokens' keys come from the fresh k/v of this forward (`new_kv`, rows `q_start[b]
+ j`, contiguous: no slot-id load in the loop's dependency chain) when the caller passes
them; they hold exactly the pool's bits when the pool has their dtype. An FP8 pool holds
quantized keys: the new tokens must attend to the same numbers that decoding and a later
prefix-cache hit read, so that outputs do not depend on what was cached. Its store kernel
writes those numbers back into the fresh k/v (kv_store.py's `write_back`: the e4m3
values times their 2^e, exact in bfloat16 and float32), and the new tokens' ranges read
them as 16-bit (or float32) tiles, the cached prefix's e4m3 tiles through the table. The
two give the same bits: a power of two scales each product and sum exactly, so q . (k 2^e)
= (q . k) 2^e, and bf16(p) (v 2^e) = bf16(p 2^e) v term by term. Without the write-back
(float16 k/v, where 2^e can reach subnormals) every key is read through the table. The
e4m3 tiles go into the dots as they are (exact in bf16/fp16) and each key's 2^e
multiplies its scores and its softmax weights, a vector per tile rather than a [N, D]
tile twice.

Deterministic mode (`absolute_tiles`) replaces the three ranges: query blocks start at
multiples of BLOCK_M in absolute positions and key tiles at multiples of BLOCK_N, every
key read through the table; the tiles below the block's own are unmasked, its own (and
any after it up to the block's last row) masked. A token's sums then depend on its
position and its keys only, so a decode row (a one-token extend) and the same token in
any prefill chunk get the same bits.

GQA: the G query heads of a KV head (query head h reads KV head h // G) are folded into
the program's rows (BLOCK_M tokens x G heads, G rounded up to a power of two), so each
key/value tile is read once per group, and the diagonal's masked waste spans BLOCK_M
tokens, not BLOCK_M * G. Scores and running sums are float32; the matrix products take
the pool's dtype (bf16/fp16) operands and accumulate into the float32 output tile in
place (`tl.dot(p, v, acc)`). Programs are launched longest-first (the last token blocks,
which see the most keys) so the short ones fill the tail.

Tile sizes come from `extend_config`, keyed by the batch's longest extend: short extends
(chunk tails, forced tokens) keep 4 warps, where a few programs are all there is; long
extends use 8 warps (two warpgroups of 64 rows on Hopper) and a third pipeline stage.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixmesh.worker.attention.kernels.fp16_shift import rows_to_fp16, weights_to_fp16_range
from radixmesh.worker.attention.kernels.kv_store import (
    pow2,
    writes_back_exactly,
)

LOG2E = 1.0 / math.log(2.0)
FP8_PREFIX_F16_SWITCH = "RADIXMESH_FP8_EXTEND_F16"  # "1": `fp16_prefix` for bf16 queries
# From this longest extend on, the long-extend tiles (8 warps, 64-key tiles: they pay once
# each program loops over thousands of keys). Measured at 512 and 8,192 new tokens only;
# the crossover between them is not, so the cut sits at a round value between.
LONG_EXTEND = 2048


@dataclass(frozen=True)
class ExtendConfig:
    """block_rows: query rows a program (new tokens x folded heads); block_n: keys a tile."""

    block_rows: int
    block_n: int
    num_warps: int
    num_stages: int


def extend_config(max_extend: int, head_dim: int) -> ExtendConfig:
    """The tile table, from a sweep of 54 tiles on the engine's extend shapes (H200,
    2026-12-02, `bench.attention_kernels --grid-sweep`, attention_sweep-h200.json).
    Short extends take 32-key tiles, 4 warps and 3 stages: the best tile over the four
    short shapes together (16 x 512 214, 16 x 512 over 1,536 cached 312, 32 x 256 138,
    64 x 64 over 1,536 cached 265 TFLOP/s; the previous 64-key tiles gave 183, 264, 110,
    222). Long extends take 64-key tiles with 8 warps (1 x 8,192: 481 against 444).
    Head dims past 128 keep 32-key tiles so 3 stages of K and V fit in shared memory."""
    if max_extend < LONG_EXTEND:
        return ExtendConfig(128, 32, 4, 3)
    return ExtendConfig(128, 64 if head_dim <= 128 else 32, 8, 3)


@triton.jit
def _load_kv(
    K,
    V,
    K_scale,
    V_scale,
    rows,
    n_mask,
    kv_head,
    offs_d,
    d_mask,
    stride_k_row,
    stride_k_head,
    stride_v_row,
    stride_v_head,
    stride_scale_row,
    BOUNDED: tl.constexpr,
    D_PAD: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """K/V tiles [N, D] of rows `rows` [N] (int64) for one KV head, and for an FP8 pool
    the 2^e of each row's (slot, head) for K and V ([N] float32; unused otherwise): the
    step scales the scores and weights by them rather than the tiles."""
    k_off = rows[:, None] * stride_k_row + kv_head * stride_k_head + offs_d[None, :]
    v_off = rows[:, None] * stride_v_row + kv_head * stride_v_head + offs_d[None, :]
    if BOUNDED:
        mask = n_mask[:, None] & d_mask[None, :] if D_PAD else n_mask[:, None]
        k = tl.load(K + k_off, mask=mask, other=0.0)
        v = tl.load(V + v_off, mask=mask, other=0.0)
    elif D_PAD:
        k = tl.load(K + k_off, mask=d_mask[None, :], other=0.0)
        v = tl.load(V + v_off, mask=d_mask[None, :], other=0.0)
    else:
        k = tl.load(K + k_off)
        v = tl.load(V + v_off)
    if KV_FP8:
        scale_off = rows * stride_scale_row + kv_head
        k_pow = pow2(tl.load(K_scale + scale_off, mask=n_mask, other=0).to(tl.int32))
        v_pow = pow2(tl.load(V_scale + scale_off, mask=n_mask, other=0).to(tl.int32))
    else:
        k_pow = tl.zeros_like(rows).to(tl.float32)
        v_pow = k_pow
    return k, v, k_pow, v_pow


@triton.jit
def _softmax_step(
    acc,
    l_i,
    m_i,
    q,
    k,
    v,
    k_pow,
    v_pow,
    q_pow,
    visible,
    scale_log2,
    MASKED: tl.constexpr,
    IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
    F16: tl.constexpr,
):
    """One key tile of the online softmax (log2 units). Unmasked tiles fold the scale into
    the max and the exponent's argument (one FMA a score); masked ones scale first so -inf
    stays -inf. Every row has seen a key by its first masked tile (the prefix, or key 0 of
    the new tokens, comes first), so m_new is finite and no row divides 0 by 0.

    `F16` (an FP8 pool's tiles, the query already shifted into fp16 by q_pow [R], a
    power of two a row): e4m3 keys and values become fp16 with one conversion per two
    values (to bf16 they take a second per value), the scores are unshifted by q_pow, and
    each row's weights are shifted into fp16's range for the P.V product and back."""
    k = k.to(q.dtype)  # no-op but for an FP8 pool's e4m3 tiles (exact in the query's dtype)
    if IEEE:  # noqa: SIM108 (a constexpr branch: one compiled path)
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if F16:  # both shifts are powers of two: exact
        s = s * k_pow[None, :] * q_pow[:, None]
    elif KV_FP8:  # q . (k 2^e) = (q . k) 2^e exactly: a power of two scales every term
        s = s * k_pow[None, :]
    if MASKED:
        s = tl.where(visible, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
    else:  # scale_log2 > 0, so max(s) * scale is the max of the scaled scores
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2)
        p = tl.exp2(s * scale_log2 - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if F16:  # each row's weights (with the values' 2^e) shifted into [1, 2) at the top
        p = p * v_pow[None, :]
        p, e_w = weights_to_fp16_range(p)
        pv = tl.dot(p.to(tl.float16), v.to(tl.float16))
        return acc + pv * pow2(e_w)[:, None], l_i, m_new
    if KV_FP8 and q.dtype == tl.float16:  # p 2^e would fall into fp16's subnormals
        v = (v.to(tl.float32) * v_pow[:, None]).to(tl.float16)
    elif KV_FP8:  # p (v 2^e) = (p 2^e) v: the key's scale on its weight, [R, N] not [N, D]
        v = v.to(q.dtype)
        p = p * v_pow[None, :]
    if IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _extend_kernel(
    Q,
    K_buf,
    V_buf,
    K_scale,
    V_scale,
    K_new,
    V_new,
    O,
    req_to_token,
    req_rows,
    prefix_lens,
    extend_lens,
    q_start,
    scale_log2,
    num_kv_heads,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_buf_slot,
    stride_buf_head,
    stride_scale_slot,
    stride_knew_t,
    stride_knew_h,
    stride_vnew_t,
    stride_vnew_h,
    stride_table,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
    NEW_CONTIG: tl.constexpr,
    NEW_FP8: tl.constexpr,
    ABS_TILES: tl.constexpr,
    PREFIX_F16: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // num_kv_heads
    kv_head = pid % num_kv_heads
    # Axis 1 runs longest-first: block index descending (later tokens see more keys).
    m_block = tl.num_programs(1) - 1 - tl.program_id(1)
    extend = tl.load(extend_lens + b)
    prefix = tl.load(prefix_lens + b)
    if ABS_TILES:  # noqa: SIM108 (constexpr) blocks of absolute positions from <= prefix
        m0 = m_block * BLOCK_M - prefix % BLOCK_M
    else:
        m0 = m_block * BLOCK_M
    if m0 >= extend:
        return
    start = tl.load(q_start + b).to(tl.int64)
    table_row = req_to_token + tl.load(req_rows + b).to(tl.int64) * stride_table

    # Row r is new token m0 + r // GROUP_P2, query head kv_head * GROUP + r % GROUP_P2
    # (rows past GROUP masked): one K/V tile serves the whole group.
    offs_r = tl.arange(0, BLOCK_M * GROUP_P2)
    offs_m = m0 + offs_r // GROUP_P2  # [R] index among the new tokens
    g = offs_r % GROUP_P2
    h = kv_head * GROUP + g
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    m_mask = (offs_m >= 0) & (offs_m < extend) & (g < GROUP)
    d_mask = offs_d < HEAD_DIM
    q_ptrs = Q + (start + offs_m)[:, None] * stride_qt + h[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)  # [R, D]
    if PREFIX_F16:  # for the FP8 prefix's tiles: each row shifted into fp16's range, exactly
        q_prefix, q_pow = rows_to_fp16(q)
    else:
        q_prefix = q
        q_pow = tl.zeros([BLOCK_M * GROUP_P2], tl.float32)

    m_i = tl.full([BLOCK_M * GROUP_P2], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * GROUP_P2], tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_P2, BLOCK_D], tl.float32)
    all_rows = offs_r >= 0  # [R] true: the unmasked steps' (unused) visibility

    if ABS_TILES:
        # Key tiles at absolute positions (multiples of BLOCK_N), all through the table:
        # those below the tile holding the block's first position unmasked, from it to the
        # block's last position masked. BLOCK_M divides BLOCK_N, so the block lies in one
        # tile and each row's steps depend on its own position only: the same bits as a
        # decode row, as a row of any chunk, over any cached prefix. Keys past a row are
        # masked (exact zeros); keys past the block's last are not even loaded.
        first = prefix + m0  # a multiple of BLOCK_M
        last = prefix + tl.minimum(extend, m0 + BLOCK_M) - 1
        diagonal = (first // BLOCK_N) * BLOCK_N
        for n0 in range(0, diagonal, BLOCK_N):
            slots = tl.load(table_row + n0 + offs_n).to(tl.int64)
            k, v, k_pow, v_pow = _load_kv(
                K_buf, V_buf, K_scale, V_scale, slots, offs_n >= 0, kv_head, offs_d, d_mask,
                stride_buf_slot, stride_buf_head, stride_buf_slot, stride_buf_head,
                stride_scale_slot, False, D_PAD, KV_FP8,
            )  # fmt: skip
            acc, l_i, m_i = _softmax_step(
                acc,
                l_i,
                m_i,
                q,
                k,
                v,
                k_pow,
                v_pow,
                q_pow,
                all_rows[:, None],
                scale_log2,
                False,
                IEEE,
                KV_FP8,
                False,
            )
        for n0 in range(diagonal, last + 1, BLOCK_N):
            keys = n0 + offs_n
            n_mask = keys <= last
            slots = tl.load(table_row + keys, mask=n_mask, other=0).to(tl.int64)
            k, v, k_pow, v_pow = _load_kv(
                K_buf, V_buf, K_scale, V_scale, slots, n_mask, kv_head, offs_d, d_mask,
                stride_buf_slot, stride_buf_head, stride_buf_slot, stride_buf_head,
                stride_scale_slot, True, D_PAD, KV_FP8,
            )  # fmt: skip
            visible = n_mask[None, :] & (keys[None, :] <= prefix + offs_m[:, None])
            acc, l_i, m_i = _softmax_step(
                acc,
                l_i,
                m_i,
                q,
                k,
                v,
                k_pow,
                v_pow,
                q_pow,
                visible,
                scale_log2,
                True,
                IEEE,
                KV_FP8,
                False,
            )
    else:
        # 1. The cached prefix, through the table: full tiles unmasked, then the partial one.
        prefix_full = (prefix // BLOCK_N) * BLOCK_N
        for n0 in range(0, prefix_full, BLOCK_N):
            slots = tl.load(table_row + n0 + offs_n).to(tl.int64)
            k, v, k_pow, v_pow = _load_kv(
                K_buf, V_buf, K_scale, V_scale, slots, offs_n >= 0, kv_head, offs_d, d_mask,
                stride_buf_slot, stride_buf_head, stride_buf_slot, stride_buf_head,
                stride_scale_slot, False, D_PAD, KV_FP8,
            )  # fmt: skip
            acc, l_i, m_i = _softmax_step(
                acc,
                l_i,
                m_i,
                q_prefix,
                k,
                v,
                k_pow,
                v_pow,
                q_pow,
                all_rows[:, None],
                scale_log2,
                False,
                IEEE,
                KV_FP8,
                PREFIX_F16,
            )
        if prefix_full < prefix:
            n_mask = prefix_full + offs_n < prefix
            slots = tl.load(table_row + prefix_full + offs_n, mask=n_mask, other=0).to(tl.int64)
            k, v, k_pow, v_pow = _load_kv(
                K_buf, V_buf, K_scale, V_scale, slots, n_mask, kv_head, offs_d, d_mask,
                stride_buf_slot, stride_buf_head, stride_buf_slot, stride_buf_head,
                stride_scale_slot, True, D_PAD, KV_FP8,
            )  # fmt: skip
            acc, l_i, m_i = _softmax_step(
                acc,
                l_i,
                m_i,
                q_prefix,
                k,
                v,
                k_pow,
                v_pow,
                q_pow,
                n_mask[None, :],
                scale_log2,
                True,
                IEEE,
                KV_FP8,
                PREFIX_F16,
            )

        # 2.-3. The new tokens j = 0 .. the block's last: off-diagonal tiles unmasked, then the
        # diagonal tiles with the causal mask (and the bound: keys past `extend` do not exist).
        if NEW_CONTIG:
            new_k, new_v = K_new, V_new
            k_row, k_head = stride_knew_t, stride_knew_h
            v_row, v_head = stride_vnew_t, stride_vnew_h
        else:
            new_k, new_v = K_buf, V_buf
            k_row, k_head = stride_buf_slot, stride_buf_head
            v_row, v_head = stride_buf_slot, stride_buf_head
        diagonal = (m0 // BLOCK_N) * BLOCK_N
        key_end = tl.minimum(extend, m0 + BLOCK_M)
        for n0 in range(0, diagonal, BLOCK_N):
            if NEW_CONTIG:
                rows = start + n0 + offs_n
            else:
                rows = tl.load(table_row + prefix + n0 + offs_n).to(tl.int64)
            k, v, k_pow, v_pow = _load_kv(
                new_k, new_v, K_scale, V_scale, rows, offs_n >= 0, kv_head, offs_d, d_mask,
                k_row, k_head, v_row, v_head, stride_scale_slot, False, D_PAD, NEW_FP8,
            )  # fmt: skip
            acc, l_i, m_i = _softmax_step(
                acc,
                l_i,
                m_i,
                q,
                k,
                v,
                k_pow,
                v_pow,
                q_pow,
                all_rows[:, None],
                scale_log2,
                False,
                IEEE,
                NEW_FP8,
                False,
            )
        for n0 in range(diagonal, key_end, BLOCK_N):
            offs_j = n0 + offs_n  # [N] index among the new tokens
            n_mask = offs_j < key_end
            if NEW_CONTIG:
                rows = start + offs_j
            else:
                rows = tl.load(table_row + prefix + offs_j, mask=n_mask, other=0).to(tl.int64)
            k, v, k_pow, v_pow = _load_kv(
                new_k, new_v, K_scale, V_scale, rows, n_mask, kv_head, offs_d, d_mask,
                k_row, k_head, v_row, v_head, stride_scale_slot, True, D_PAD, NEW_FP8,
            )  # fmt: skip
            visible = n_mask[None, :] & (offs_j[None, :] <= offs_m[:, None])
            acc, l_i, m_i = _softmax_step(
                acc,
                l_i,
                m_i,
                q,
                k,
                v,
                k_pow,
                v_pow,
                q_pow,
                visible,
                scale_log2,
                True,
                IEEE,
                NEW_FP8,
                False,
            )

    out = acc / l_i[:, None]
    o_ptrs = O + (start + offs_m)[:, None] * stride_ot + h[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def extend_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    q_start: torch.Tensor,
    max_extend: int,
    scale: float,
    *,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: ExtendConfig | None = None,
    absolute_tiles: bool = False,
    fp16_prefix: bool | None = None,
) -> torch.Tensor:
    """q/out [T, Hq, D]; k_buf/v_buf [num_slots, Hkv, D]; per-sequence int tensors [B]
    (`q_start[b]`: sequence b's first row of q); `max_extend` bounds extend_lens.

    `new_kv`: this forward's k/v [T, Hkv, D] (rows as q's, already stored in the pool and
    of its dtype; over an FP8 pool, of q's dtype and holding the pool's dequantized values,
    as kv_store's `write_back` leaves them), read for the new tokens instead of the pool.
    `config`: the tiles, `extend_config(max_extend, D)` by default.

    `absolute_tiles` (deterministic mode): query blocks and key tiles at absolute
    positions, every key read through the table (`new_kv` unused), so a token's output
    bits depend on its position and its keys only, never on where its chunk or cached
    prefix starts: a decode row (prefix = its position, extend 1) gets the bits it would
    get as a row of any prefill.

    `fp16_prefix` (an FP8 pool, 16-bit queries, not `absolute_tiles`): the cached prefix's
    e4m3 tiles go to the matrix unit as fp16, one conversion per two values, beside a
    query shifted into fp16's range per row (`_softmax_step`'s F16); the new tokens keep
    the query's dtype. None: `FP8_PREFIX_F16_SWITCH` ("1") for bfloat16 queries. Off by
    default: on the H200 (2026-12-05) it took 1.32-2.11x a bf16 pool's time against
    1.00-1.65x without (attention_kernels-fp8-prefix-f16-h200.json), so the per-row shifts
    cost more than the conversions they save in this kernel."""
    t, hq, d = q.shape
    hkv = k_buf.shape[1]
    b = req_rows.shape[0]
    assert hq % hkv == 0 and k_buf.shape[2] == d and out.shape == q.shape and scale > 0
    assert q.stride(2) == out.stride(2) == k_buf.stride(2) == 1 and v_buf.stride() == k_buf.stride()
    assert req_to_token.stride(1) == 1
    # An FP8 pool: its (k, v) scale exponents [num_slots, Hkv] int8; unused pointers else.
    k_scale, v_scale = scales if scales is not None else (k_buf, v_buf)
    assert scales is None or (k_scale.stride() == v_scale.stride() and k_scale.stride(1) == 1)
    # The fresh k/v stand in for the pool only where they hold the pool's very bits.
    if absolute_tiles:
        new_kv = None  # every key through the table
    k_new, v_new = new_kv if new_kv is not None else (k_buf, v_buf)
    if new_kv is not None:
        held = k_buf.dtype if scales is None else q.dtype  # an FP8 pool's: written back
        assert k_new.dtype == v_new.dtype == held, (k_new.dtype, held)
        assert scales is None or writes_back_exactly(held), held
        assert k_new.shape == v_new.shape == (t, hkv, d)
        assert k_new.stride(2) == v_new.stride(2) == 1
    if t == 0 or b == 0:
        return out
    if fp16_prefix is None:
        fp16_prefix = os.environ.get(FP8_PREFIX_F16_SWITCH, "0") == "1"
        fp16_prefix = fp16_prefix and scales is not None and q.dtype == torch.bfloat16
    if fp16_prefix and (scales is None or absolute_tiles or q.dtype == torch.float32):
        raise ValueError("fp16_prefix needs an FP8 pool, 16-bit queries and no absolute_tiles")
    cfg = config or extend_config(max_extend, d)
    group = hq // hkv
    group_p2 = triton.next_power_of_2(group)
    block_m = max(1, cfg.block_rows // group_p2)  # new tokens a program; rows = block_m * G
    blocks = triton.cdiv(max_extend, block_m)
    if absolute_tiles:  # a block must lie inside one key tile; the first may start early
        block_m = min(block_m, cfg.block_n)
        blocks = triton.cdiv(max_extend + block_m - 1, block_m)
    block_d = max(16, triton.next_power_of_2(d))
    grid = (b * hkv, blocks)
    _extend_kernel[grid](
        q,
        k_buf,
        v_buf,
        k_scale,
        v_scale,
        k_new,
        v_new,
        out,
        req_to_token,
        req_rows,
        prefix_lens,
        extend_lens,
        q_start,
        scale * LOG2E,
        hkv,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        k_scale.stride(0),
        k_new.stride(0),
        k_new.stride(1),
        v_new.stride(0),
        v_new.stride(1),
        req_to_token.stride(0),
        GROUP=group,
        GROUP_P2=group_p2,
        HEAD_DIM=d,
        BLOCK_D=block_d,
        D_PAD=block_d != d,
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        IEEE=q.dtype == torch.float32,
        KV_FP8=scales is not None,
        NEW_CONTIG=new_kv is not None,
        NEW_FP8=scales is not None and new_kv is None,
        ABS_TILES=absolute_tiles,
        PREFIX_F16=bool(fp16_prefix),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out


def extend_attention_ref(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: list[int],
    prefix_lens: list[int],
    extend_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """The same function in float32 PyTorch, one sequence at a time. Returns [T, Hq, D]."""
    hq, hkv = q.shape[1], k_buf.shape[1]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    start = 0
    for row, prefix, extend in zip(req_rows, prefix_lens, extend_lens, strict=True):
        slots = req_to_token[row, : prefix + extend]  # [L]
        keys = k_buf[slots].float().repeat_interleave(hq // hkv, dim=1)  # [L, Hq, D]
        values = v_buf[slots].float().repeat_interleave(hq // hkv, dim=1)
        qs = q[start : start + extend].float()  # [E, Hq, D]
        scores = torch.einsum("ehd,lhd->hel", qs, keys) * scale  # [Hq, E, L]
        q_pos = torch.arange(prefix, prefix + extend, device=q.device)[:, None]
        visible = torch.arange(prefix + extend, device=q.device)[None, :] <= q_pos  # [E, L]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[start : start + extend] = torch.einsum("hel,lhd->ehd", scores.softmax(-1), values)
        start += extend
    return out
