"""Decode attention (flash-decoding): one new token per sequence over its whole KV.

Stage 1, one program per (sequence, KV head, split): the G = Hq / Hkv query heads that
share a KV head are one [G, D] block (padded to BLOCK_H >= 16 rows for the matrix unit),
so each KV head is read once for its whole group. The sequence's keys are cut into
`num_splits` equal ranges; each program runs an online softmax over its range in blocks
of BLOCK_N keys read through the slot table, and writes its partial output and
log-sum-exp (float32). Splits give a small batch enough programs to fill the GPU; an
empty split (a sequence shorter than the split count) writes lse = -inf.

Stage 2, one program per (sequence, query head), merges the splits' partials.

Over an FP8 pool (e4m3 values, a power-of-two exponent per token and head) the stored
bytes are converted for the matrix unit: to fp16 for 16-bit queries (one instruction per
two values, exact; bf16 would take a second conversion per value, which made this kernel
conversion-bound at 1.2x a bf16 pool's time on the H200), to float32 for float32 queries.
The exponents scale the scores and the softmax weights instead of the values (exact:
powers of two), and each head's query and weights are shifted by powers of two into
fp16's range. `DecodeConfig.fp8_mma` multiplies e4m3 on the matrix unit instead
(decode_fp8_mma.py; FP8_MMA_CONFIG). On CUDA (sm_89+, nvcc present) an FP8 pool's stage 1
is a CUDA C++ kernel with the conversion path's numerics by default (decode_fp8_cuda.py,
`FP8_CUDA_CONFIG`; `DecodeConfig.cuda`).

Deterministic mode does not use this kernel: its decode rows run through the extend
kernel (triton_backend.py says why).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixmesh.worker.attention.kernels import decode_fp8_cuda
from radixmesh.worker.attention.kernels.decode_fp8_mma import decode_split_fp8_mma
from radixmesh.worker.attention.kernels.decode_split import key_range, split_range
from radixmesh.worker.attention.kernels.extend_attention import extend_attention_ref
from radixmesh.worker.attention.kernels.fp16_shift import rows_to_fp16, weights_to_fp16_range
from radixmesh.worker.attention.kernels.kv_store import pow2

LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class DecodeConfig:
    """The split kernel's launch: keys per tile, warps, pipeline stages; and, over an FP8
    pool, whether to multiply e4m3 on the matrix unit (decode_fp8_mma.py) instead of
    converting keys and values to the query's dtype, or to run the CUDA kernel
    (decode_fp8_cuda.py; `num_warps` its warps per block, `min_blocks` the blocks per SM
    it is compiled for; 16-key tiles, one stage)."""

    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    fp8_mma: bool = False
    # The FP8 path's operands as one or two e4m3 terms (hi + lo: ~7 mantissa bits, as bf16)
    q_terms: int = 2
    w_terms: int = 1
    cuda: bool = False
    min_blocks: int = 0


# Most preferred first. From the decode sweep on the H200 (2026-12-02,
# `bench.attention_kernels --decode-sweep`, attention_decode_sweep-h200.json: 24 launches
# on bf16 and FP8 pools at batch x context 256 x 640, 256 x 4,096, 64 x 2,048, 1 x 4,096):
# 128-key tiles, 4 warps, 3 stages were within 3% of each shape's best on both pools
# (256 x 640: bf16 186 us, FP8 225 us) where the earlier 64 keys, 2 stages took 199 and
# 299 us; a tile's V and scale loads issued before its first dot, and a grid with a
# sequence's KV heads side by side, changed nothing beyond 2-4% either way.
DECODE_CONFIGS = [
    DecodeConfig(128, 4, 3),
    DecodeConfig(128, 4, 2),
    DecodeConfig(64, 4, 3),
    DecodeConfig(64, 4, 2),
    DecodeConfig(32, 4, 2),
]

# The FP8 matrix-unit path's fastest launch on the H200 (`bench.attention_kernels
# --decode-sweep`, 2026-12-04): 128 keys (two 64-row wgmma tiles for 4 warps), 2 stages,
# one e4m3 term each for the query and the weights. Not the default (docs/performance.md,
# "FP8 KV decode"): ~10% faster than the fp16 conversion path on long batches, at ~20x its
# error on random data.
FP8_MMA_CONFIG = DecodeConfig(128, 4, 2, fp8_mma=True, q_terms=1, w_terms=1)

# The CUDA kernel's launch over an FP8 pool where it applies (decode_fp8_cuda.py): 2 warps
# a block, 16 keys a warp at a time, compiled for 8 blocks an SM (128 registers); the
# fastest of its launches in the H200's decode sweep (2026-12-05, docs/performance.md).
FP8_CUDA_CONFIG = DecodeConfig(16, 2, 1, cuda=True, min_blocks=8)


def fp8_cuda_config() -> DecodeConfig:
    """FP8_CUDA_CONFIG, or the launch RADIXMESH_FP8_DECODE names (decode_fp8_cuda.py)."""
    launch = decode_fp8_cuda.launch_override()
    if launch is None:
        return FP8_CUDA_CONFIG
    warps, keys, stages, min_blocks = launch
    return DecodeConfig(keys, warps, stages, cuda=True, min_blocks=min_blocks)


def decode_config(block_d: int, elem_bytes: int, max_shared: int) -> DecodeConfig:
    """The first of DECODE_CONFIGS whose stages of K and V tiles (in the query's dtype, an
    upper bound for an FP8 pool's) fit the device's shared memory with 16 KiB to spare."""
    for cfg in DECODE_CONFIGS:
        if cfg.num_stages * 2 * cfg.block_n * block_d * elem_bytes <= max_shared - 16 * 1024:
            return cfg
    return DECODE_CONFIGS[-1]


@functools.cache
def _max_shared_memory(device_index: int) -> int:
    props = triton.runtime.driver.active.utils.get_device_properties(device_index)
    return int(props["max_shared_mem"])


def max_shared_memory(device: torch.device) -> int:
    """Shared memory a program may take on `device` (the interpreter: no limit)."""
    if device.type != "cuda":
        return 1 << 30
    return _max_shared_memory(device.index if device.index is not None else 0)


@triton.jit
def _shift_q(q, scale_log2, BLOCK_R: tl.constexpr, F16: tl.constexpr):
    """Query rows [R, D] for the matrix unit and their score scales [R] (log2 units): over
    an FP8 pool with 16-bit queries each row shifted by a power of two into fp16's range,
    exactly, the shift undone on the scores."""
    q_scale = tl.full([BLOCK_R], scale_log2, tl.float32)
    if F16:
        q, q_pow = rows_to_fp16(q)
        q_scale = q_scale * q_pow
    return q, q_scale


@triton.jit
def _attend(
    q,
    q_scale,
    table_row,
    lo,
    hi,
    K_buf,
    V_buf,
    K_scale,
    V_scale,
    kv_head,
    offs_d,
    d_mask,
    stride_buf_slot,
    stride_buf_head,
    stride_scale_slot,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
    F16: tl.constexpr,
):
    """Query rows q [R, D] (one KV head's) over keys [lo, hi) of the slot-table row
    `table_row`, online softmax in BLOCK_N-key tiles: (unnormalized output [R, D], sums
    [R], running maxima [R], log2 units)."""
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    return _attend_more(
        acc, l_i, m_i, q, q_scale, table_row, lo, hi, m_i, K_buf, V_buf, K_scale, V_scale,
        kv_head, offs_d, d_mask, stride_buf_slot, stride_buf_head, stride_scale_slot,
        BLOCK_R, BLOCK_D, BLOCK_N, IEEE, KV_FP8, F16, False,
    )  # fmt: skip


@triton.jit
def _attend_more(
    acc,
    l_i,
    m_i,
    q,
    q_scale,
    table_row,
    lo,
    hi,
    rows,
    K_buf,
    V_buf,
    K_scale,
    V_scale,
    kv_head,
    offs_d,
    d_mask,
    stride_buf_slot,
    stride_buf_head,
    stride_scale_slot,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
    F16: tl.constexpr,
    SELECT: tl.constexpr,
):
    """`_attend`'s online softmax continued from (acc, l_i, m_i) over keys [lo, hi) of
    `table_row`. SELECT: only the query rows where `rows` [R] holds (the others see no
    key here and keep their state; a row that has seen none yet stays at m = -inf
    without a NaN), for keys that belong to one row of several in a tile."""
    mma_dtype = q.dtype
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        slots = tl.load(table_row + offs_n, mask=n_mask, other=0).to(tl.int64)  # [N]
        kv_off = slots[:, None] * stride_buf_slot + kv_head * stride_buf_head + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        scale_off = slots * stride_scale_slot + kv_head  # [N] (an FP8 pool's exponents)
        k = tl.load(K_buf + kv_off, mask=kv_mask, other=0.0)  # [N, D]
        if KV_FP8:  # e4m3 is exact in fp16 and float32; its 2^e scales the scores instead
            k = k.to(mma_dtype)
        if IEEE:  # noqa: SIM108 (a constexpr branch: one compiled path)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        if KV_FP8:  # q . (k 2^e) = (q . k) 2^e exactly: a power of two scales every term
            k_exp = tl.load(K_scale + scale_off, mask=n_mask, other=0).to(tl.int32)
            s = s * pow2(k_exp)[None, :]
        if SELECT:  # noqa: SIM108 (a constexpr branch: one compiled path)
            seen = rows[:, None] & n_mask[None, :]
        else:
            seen = n_mask[None, :]
        s = tl.where(seen, s * q_scale[:, None], float("-inf"))  # [R, N] log2 units
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # -inf - -inf would be NaN: a row that saw no key gets weights and alpha 0 instead.
        if SELECT:  # noqa: SIM108
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V_buf + kv_off, mask=kv_mask, other=0.0)  # [N, D]
        if KV_FP8:  # p (v 2^e) = (p 2^e) v: the key's scale on its weight, [R, N] not [N, D]
            v_exp = tl.load(V_scale + scale_off, mask=n_mask, other=0).to(tl.int32)
            v = v.to(mma_dtype)
            p = p * pow2(v_exp)[None, :]
        if F16:  # each row's weights shifted into [1, 2) at the top: no fp16 subnormals
            p, e_w = weights_to_fp16_range(p)
        if IEEE:  # noqa: SIM108
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        if F16:
            pv = pv * pow2(e_w)[:, None]
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _store_partial(Mid_O, Mid_L, mid, acc, l_i, m_i, row_mask, offs_d, d_mask, stride_mid_s):
    """Rows' partial outputs and log2-sum-exps at workspace offsets `mid` [R]; -inf for a
    row that saw no key (an empty split)."""
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    tl.store(Mid_O + mid[:, None] + offs_d[None, :], out, mask=row_mask[:, None] & d_mask[None, :])
    tl.store(Mid_L + mid // stride_mid_s, lse, mask=row_mask)


@triton.jit
def _decode_split_kernel(
    Q,
    K_buf,
    V_buf,
    K_scale,
    V_scale,
    Mid_O,
    Mid_L,
    req_to_token,
    req_rows,
    seq_lens,
    Starts,
    scale_log2,
    num_splits,
    split_base,
    stride_qt,
    stride_qh,
    stride_buf_slot,
    stride_buf_head,
    stride_scale_slot,
    stride_table,
    stride_mid_b,
    stride_mid_h,
    stride_mid_s,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
    F16: tl.constexpr,
    HAS_START: tl.constexpr,
):
    """`HAS_START`: sequence b's keys from Starts[b] on (those before are another kernel's:
    decode_attention_shared), its splits written from workspace split `split_base` on."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if HAS_START:
        table_row = req_to_token + tl.load(req_rows + b).to(tl.int64) * stride_table
        start = tl.load(Starts + b).to(tl.int32)
        lo, hi = key_range(start, tl.load(seq_lens + b).to(tl.int32), split, num_splits, BLOCK_N)
    else:
        table_row, lo, hi = split_range(
            req_to_token, req_rows, seq_lens, stride_table, num_splits, BLOCK_N
        )

    offs_g = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g  # [H] query heads of this KV head
    q_ptrs = Q + b.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)  # [H, D]
    q, q_scale = _shift_q(q, scale_log2, BLOCK_H, F16)
    acc, l_i, m_i = _attend(
        q, q_scale, table_row, lo, hi, K_buf, V_buf, K_scale, V_scale, kv_head, offs_d,
        d_mask, stride_buf_slot, stride_buf_head, stride_scale_slot, BLOCK_H, BLOCK_D,
        BLOCK_N, IEEE, KV_FP8, F16,
    )  # fmt: skip
    if HAS_START:
        split = split + split_base
    mid = b.to(tl.int64) * stride_mid_b + heads * stride_mid_h + split * stride_mid_s
    _store_partial(Mid_O, Mid_L, mid, acc, l_i, m_i, g_mask, offs_d, d_mask, stride_mid_s)


@triton.jit
def _decode_merge_kernel(
    Mid_O,
    Mid_L,
    O,
    num_splits,
    stride_ot,
    stride_oh,
    stride_mid_b,
    stride_mid_h,
    stride_mid_s,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    # All splits at once: one load of their log-sum-exps and partial outputs, no chain of
    # dependent loads over the splits. A loop over 32 splits (the batch-1 decode graph's
    # count) cost ~10 us a layer on the H200, more than the split kernel itself.
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, BLOCK_S)
    d_mask = offs_d < HEAD_DIM
    s_mask = offs_s < num_splits
    base = b.to(tl.int64) * stride_mid_b + h * stride_mid_h
    # -inf marks an empty split. Some split of every row holds a key (split 0 of the flat
    # kernel, seq_len >= 1; a row's own keys in decode_shared.py), so m is finite.
    lse = tl.load(Mid_L + base // stride_mid_s + offs_s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp2(lse - m)  # [S], 0 for empty splits
    o_ptrs = Mid_O + base + offs_s[:, None] * stride_mid_s + offs_d[None, :]
    # An empty split's partial output is not read: decode_shared.py leaves it unwritten.
    full = s_mask & (lse > float("-inf"))
    o = tl.load(o_ptrs, mask=full[:, None] & d_mask[None, :], other=0.0)  # [S, D]
    acc = tl.sum(o * w[:, None], 0)  # [D]
    out = acc / tl.sum(w, 0)
    out_ptrs = O + b.to(tl.int64) * stride_ot + h * stride_oh + offs_d
    tl.store(out_ptrs, out.to(O.dtype.element_ty), mask=d_mask)


def decode_workspace(
    batch_size: int, num_heads: int, head_dim: int, num_splits: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs [B, Hq, S, D] and log-sum-exps [B, Hq, S] (float32)."""
    mid_o = torch.empty(
        (batch_size, num_heads, num_splits, head_dim), dtype=torch.float32, device=device
    )
    mid_l = torch.empty((batch_size, num_heads, num_splits), dtype=torch.float32, device=device)
    return mid_o, mid_l


def _decode_split(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    workspace: tuple[torch.Tensor, torch.Tensor],
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale_log2: float,
    num_splits: int,
    cfg: DecodeConfig,
    kv_fp8: bool,
    starts: torch.Tensor | None = None,
    split_base: int = 0,
) -> None:
    """Stage 1 with keys and values in the query's dtype (an FP8 pool's converted).
    `starts` [B]: each sequence's keys from there on, into splits `split_base` on."""
    b, hq, d = q.shape
    hkv = k_buf.shape[1]
    group = hq // hkv
    mid_o, mid_l = workspace
    _decode_split_kernel[(b, hkv, num_splits)](
        q,
        k_buf,
        v_buf,
        k_scale,
        v_scale,
        mid_o,
        mid_l,
        req_to_token,
        req_rows,
        seq_lens,
        seq_lens if starts is None else starts,  # not read without HAS_START
        scale_log2,
        num_splits,
        split_base,
        q.stride(0),
        q.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        k_scale.stride(0),
        req_to_token.stride(0),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        GROUP=group,
        HEAD_DIM=d,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_N=cfg.block_n,
        IEEE=q.dtype == torch.float32,
        KV_FP8=kv_fp8,
        F16=kv_fp8 and q.dtype != torch.float32,
        HAS_START=starts is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """q/out [B, Hq, D] (row b is sequence b's new token); k_buf/v_buf [num_slots, Hkv, D];
    req_rows, seq_lens [B]. `workspace` from `decode_workspace` (allocated if None);
    `config` defaults to `decode_config` for this head dim, dtype and device."""
    b, hq, d = q.shape
    hkv = k_buf.shape[1]
    assert hq % hkv == 0 and k_buf.shape[2] == d and out.shape == q.shape
    assert q.stride(2) == out.stride(2) == k_buf.stride(2) == 1 and v_buf.stride() == k_buf.stride()
    assert req_to_token.stride(1) == 1 and num_splits >= 1
    # An FP8 pool: its (k, v) scale exponents [num_slots, Hkv] int8; unused pointers else.
    k_scale, v_scale = scales if scales is not None else (k_buf, v_buf)
    assert scales is None or (k_scale.stride() == v_scale.stride() and k_scale.stride(1) == 1)
    if b == 0:
        return out
    if workspace is None:
        workspace = decode_workspace(b, hq, d, num_splits, q.device)
    mid_o, mid_l = workspace
    assert mid_o.shape == (b, hq, num_splits, d) and mid_o.is_contiguous(), mid_o.shape
    assert mid_l.shape == (b, hq, num_splits) and mid_l.is_contiguous(), mid_l.shape
    block_d = max(16, triton.next_power_of_2(d))
    if config is None and scales is not None and decode_fp8_cuda.applies(q, k_buf):
        config = fp8_cuda_config()
    cfg = config or decode_config(block_d, q.element_size(), max_shared_memory(q.device))
    # mid_l is addressed as mid_o's offset // D: both are contiguous with the same leading dims.
    # e4m3 matrix products take K >= 32 (the head dim, and the tile's keys) on the GPU.
    if scales is not None and cfg.cuda:
        decode_fp8_cuda.decode_split_fp8_cuda(
            q, k_buf, v_buf, scales, workspace, req_to_token, req_rows, seq_lens,
            scale * LOG2E, num_splits, cfg.num_warps, cfg.min_blocks,
        )  # fmt: skip
    elif scales is not None and cfg.fp8_mma and min(block_d, cfg.block_n) >= 32:
        decode_split_fp8_mma(
            q, k_buf, v_buf, scales, workspace, req_to_token, req_rows, seq_lens,
            scale * LOG2E, num_splits, cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.q_terms,
            cfg.w_terms,
        )  # fmt: skip
    else:
        _decode_split(
            q, k_buf, v_buf, k_scale, v_scale, workspace, req_to_token, req_rows, seq_lens,
            scale * LOG2E, num_splits, cfg, scales is not None,
        )  # fmt: skip
    return merge_splits(workspace, out, num_splits)


def merge_splits(
    workspace: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor, num_splits: int
) -> torch.Tensor:
    """Stage 2: each (sequence, query head)'s splits in `workspace` merged into `out`."""
    mid_o, mid_l = workspace
    b, hq, d = out.shape
    _decode_merge_kernel[(b, hq)](
        mid_o,
        mid_l,
        out,
        num_splits,
        out.stride(0),
        out.stride(1),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        HEAD_DIM=d,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
    )
    return out


def decode_attention_ref(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: list[int],
    seq_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """Decode is extend by one token after a prefix of seq_len - 1. Returns [B, Hq, D] fp32."""
    prefix = [n - 1 for n in seq_lens]
    ones = [1] * len(seq_lens)
    return extend_attention_ref(q, k_buf, v_buf, req_to_token, req_rows, prefix, ones, scale)
