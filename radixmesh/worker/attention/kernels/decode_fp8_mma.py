"""Decode attention over an FP8 pool on the FP8 matrix unit (Hopper's e4m3 wgmma).

The split kernel of `decode_attention.py` converts every e4m3 key and value to the
query's dtype before its matrix products. On the H200 that conversion, not the bytes,
bounds it: per 128-key tile each thread runs ~384 conversions (e4m3 -> f16 -> bf16) and
128 one-byte shared-memory loads, so an FP8 pool decoded at 1.5-1.8 TB/s where a bf16
pool reaches 3.7-4.4 (docs/performance.md). This kernel feeds the stored bytes to the
matrix unit as they are and quantizes the two small operands instead:

- scores: the keys are the left operand, s^T [N, H] = K [N, D] . Q^T [D, H], so that the
  matrix unit's M dimension is the tile's N keys (wgmma needs M >= 64; the G query heads
  of a KV head, padded to BLOCK_H = 16, are only its N). The query is quantized once a
  program, each head with a power-of-two scale 2^eq that brings max|q| into (224, 448];
  the score is then (q8 . k8) 2^eq 2^ek exactly as the matrix unit summed it.
- output: o^T [D, H] = V^T [D, N] . W [N, H], with W the softmax weights times each
  key's value scale 2^ev, quantized to e4m3 after a power-of-two shift per head that puts
  the head's largest weight in [128, 256) (e4m3 holds 448), undone on the product.
- the softmax's running max, sum and rescaling stay float32, the sum over the unrounded
  weights; partial outputs and log-sum-exps go to the same workspace as the split
  kernel's, merged by its merge kernel.

What it costs in precision: q and the weights carry e4m3's 3 mantissa bits (FlashAttention-3's
FP8 path does the same; docs/quantization.md has the measured error on the bundled model).
A weight below 2^-16 of its head's largest in the tile rounds to zero (e4m3's least
subnormal is 2^-9).

The values must reach the matrix unit with their N dimension contiguous (e4m3 wgmma takes
K-major operands only), so each V tile is transposed on the way: on the GPU in registers,
4 x 4 bytes at a time (`_load_v_transposed`); the keys go straight from their cp.async
stage.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixmesh.worker.attention.kernels.decode_split import split_range
from radixmesh.worker.attention.kernels.kv_store import ceil_log2, floor_log2, pow2
from radixmesh.worker.layers.kernels.fp8_quant import round_to_e4m3


@triton.jit
def _to_e4m3(x, SOFTWARE_ROUND: tl.constexpr):
    """float32 x, |x| <= 448 -> e4m3, rounded to nearest even (the interpreter's own cast
    rounds wrongly: fp8_quant.round_to_e4m3)."""
    if SOFTWARE_ROUND:
        x = round_to_e4m3(x)
    return x.to(tl.float8e4nv)


@triton.jit
def _transpose_4x4_bytes(v0, v1, v2, v3, PTX: tl.constexpr):
    """Four int32 words (key j's bytes k: 4 dims of one key) -> four words (word k's byte j:
    one dim of 4 keys): byte permutes in registers (PTX), or shifts (the interpreter)."""
    if PTX:
        return tl.inline_asm_elementwise(
            """
            {
            .reg .b32 lo01, hi01, lo23, hi23;
            prmt.b32 lo01, $4, $5, 0x5140;
            prmt.b32 hi01, $4, $5, 0x7362;
            prmt.b32 lo23, $6, $7, 0x5140;
            prmt.b32 hi23, $6, $7, 0x7362;
            prmt.b32 $0, lo01, lo23, 0x5410;
            prmt.b32 $1, lo01, lo23, 0x7632;
            prmt.b32 $2, hi01, hi23, 0x5410;
            prmt.b32 $3, hi01, hi23, 0x7632;
            }
            """,
            "=r,=r,=r,=r,r,r,r,r",
            [v0, v1, v2, v3],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True,
            pack=1,
        )
    else:
        return (
            _gather_byte(v0, v1, v2, v3, 0),
            _gather_byte(v0, v1, v2, v3, 8),
            _gather_byte(v0, v1, v2, v3, 16),
            _gather_byte(v0, v1, v2, v3, 24),
        )


@triton.jit
def _gather_byte(v0, v1, v2, v3, shift):
    """The byte at `shift` of each of four words, as one word (v0's lowest)."""
    b0 = (v0 >> shift) & 0xFF
    b1 = (v1 >> shift) & 0xFF
    b2 = (v2 >> shift) & 0xFF
    b3 = (v3 >> shift) & 0xFF
    return b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)


@triton.jit
def _load_v_transposed(
    V_words, slots, n_mask, kv_head, stride_buf_slot, stride_buf_head, BLOCK_N, BLOCK_D, PTX
):
    """A V tile [N, D] of e4m3, read as int32 words, returned transposed [D, N]: each
    thread transposes 4 x 4 byte blocks in registers, so the tile reaches the matrix unit's
    shared memory in whole words (the compiler's own transpose of an 8-bit tile stores
    single bytes, with 6-7-way bank conflicts: it cost more than the conversion it saves)."""
    offs_w = tl.arange(0, BLOCK_D // 4)
    w_off = slots[:, None] * (stride_buf_slot // 4) + kv_head * (stride_buf_head // 4)
    words = tl.load(V_words + w_off + offs_w[None, :], mask=n_mask[:, None], other=0)
    words = tl.permute(tl.reshape(words, [BLOCK_N // 4, 4, BLOCK_D // 4]), [0, 2, 1])
    # A [..., 2, 2] reshape holds element 2a + b at [a, b]; split and join act on b.
    even, odd = tl.split(tl.reshape(words, [BLOCK_N // 4, BLOCK_D // 4, 2, 2]))
    v0, v2 = tl.split(even)
    v1, v3 = tl.split(odd)
    t0, t1, t2, t3 = _transpose_4x4_bytes(v0, v1, v2, v3, PTX)  # [N/4, D/4]: dim 4c+k, keys 4i..
    t = tl.reshape(tl.join(tl.join(t0, t2), tl.join(t1, t3)), [BLOCK_N // 4, BLOCK_D // 4, 4])
    t = tl.reshape(tl.permute(t, [1, 2, 0]), [BLOCK_D, BLOCK_N // 4])  # [d, i]
    b0, b1, b2, b3 = t & 0xFF, (t >> 8) & 0xFF, (t >> 16) & 0xFF, (t >> 24) & 0xFF
    b = tl.join(tl.join(b0, b2), tl.join(b1, b3))  # [D, N/4, 4]: keys 4i + j
    return tl.reshape(b, [BLOCK_D, BLOCK_N]).to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _decode_split_fp8_mma_kernel(
    Q,
    K_buf,
    V_buf,
    V_words,
    K_scale,
    V_scale,
    Mid_O,
    Mid_L,
    req_to_token,
    req_rows,
    seq_lens,
    scale_log2,
    num_splits,
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
    Q_TERMS: tl.constexpr,
    W_TERMS: tl.constexpr,
    SOFTWARE_ROUND: tl.constexpr,
    TRANSPOSE_IN_REGISTERS: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    table_row, lo, hi = split_range(
        req_to_token, req_rows, seq_lens, stride_table, num_splits, BLOCK_N
    )

    offs_g = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g  # [H] query heads of this KV head
    q_ptrs = Q + b.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    # Each head's power-of-two scale: max|q| / 2^eq in (224, 448] (padding rows: any).
    eq = tl.minimum(ceil_log2(tl.math.div_rn(tl.max(tl.abs(q), 1), 448.0)), 126)
    q = q * pow2(-eq)[:, None]
    q8 = _to_e4m3(q, SOFTWARE_ROUND)  # [H, D]
    if Q_TERMS == 2:  # the rounding error, 2^4 larger (at most half an e4m3 step: <= 16)
        q8_lo = _to_e4m3((q - q8.to(tl.float32)) * 16.0, SOFTWARE_ROUND)
    q_scale = pow2(eq) * scale_log2  # [H]: back to scores, in log2 units

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_D, BLOCK_H], tl.float32)  # the output, transposed
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        slots = tl.load(table_row + offs_n, mask=n_mask, other=0).to(tl.int64)  # [N]
        kv_off = slots[:, None] * stride_buf_slot + kv_head * stride_buf_head + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        scale_off = slots * stride_scale_slot + kv_head  # [N]
        k = tl.load(K_buf + kv_off, mask=kv_mask, other=0.0)  # [N, D] e4m3
        s = tl.dot(k, tl.trans(q8))  # [N, H]
        if Q_TERMS == 2:
            s += tl.dot(k, tl.trans(q8_lo)) * 0.0625
        k_exp = tl.load(K_scale + scale_off, mask=n_mask, other=0).to(tl.int32)
        s = s * pow2(k_exp)[:, None] * q_scale[None, :]
        s = tl.where(n_mask[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[None, :])  # [N, H]
        l_i = l_i * alpha + tl.sum(p, 0)
        if TRANSPOSE_IN_REGISTERS:
            vt = _load_v_transposed(
                V_words, slots, n_mask, kv_head, stride_buf_slot, stride_buf_head,
                BLOCK_N, BLOCK_D, not SOFTWARE_ROUND,
            )  # fmt: skip
        else:
            vt = tl.trans(tl.load(V_buf + kv_off, mask=kv_mask, other=0.0))  # [D, N] e4m3
        v_exp = tl.load(V_scale + scale_off, mask=n_mask, other=0).to(tl.int32)
        w = p * pow2(v_exp)[:, None]  # [N, H]: each weight times its key's value scale
        # Each head's weights shifted so that its largest lands in [128, 256).
        e_w = floor_log2(tl.max(w, 0))  # [H]
        w = w * pow2(tl.minimum(tl.maximum(7 - e_w, -126), 127))[None, :]
        w8 = _to_e4m3(w, SOFTWARE_ROUND)
        pv = tl.dot(vt, w8)  # [D, H]
        if W_TERMS == 2:
            w8_lo = _to_e4m3((w - w8.to(tl.float32)) * 16.0, SOFTWARE_ROUND)
            pv += tl.dot(vt, w8_lo) * 0.0625
        pv = pv * pow2(tl.minimum(tl.maximum(e_w - 7, -126), 127))[None, :]
        acc = acc * alpha[None, :] + pv
        m_i = m_new
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[None, :]  # [D, H]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    mid = b.to(tl.int64) * stride_mid_b + heads * stride_mid_h + split * stride_mid_s  # [H]
    tl.store(Mid_O + mid[None, :] + offs_d[:, None], out, mask=g_mask[None, :] & d_mask[:, None])
    tl.store(Mid_L + mid // stride_mid_s, lse, mask=g_mask)


def decode_split_fp8_mma(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor],
    workspace: tuple[torch.Tensor, torch.Tensor],
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale_log2: float,
    num_splits: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    q_terms: int,
    w_terms: int,
) -> None:
    """Stage 1 of `decode_attention` over an FP8 pool: each (sequence, KV head, split)'s
    partial output and log-sum-exp into `workspace` (shapes: decode_attention.py)."""
    b, hq, d = q.shape
    hkv = k_buf.shape[1]
    group = hq // hkv
    mid_o, mid_l = workspace
    k_scale, v_scale = scales
    # The transpose in registers reads whole words of one head's values: a power-of-two head
    # dim of >= 16 bytes (no padded dims); others take the compiler's transpose.
    in_registers = d >= 16 and d & (d - 1) == 0
    _decode_split_fp8_mma_kernel[(b, hkv, num_splits)](
        q,
        k_buf,
        v_buf,
        v_buf.view(torch.int32) if in_registers else v_buf,
        k_scale,
        v_scale,
        mid_o,
        mid_l,
        req_to_token,
        req_rows,
        seq_lens,
        scale_log2,
        num_splits,
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
        BLOCK_N=block_n,
        Q_TERMS=q_terms,
        W_TERMS=w_terms,
        SOFTWARE_ROUND=q.device.type != "cuda",
        TRANSPOSE_IN_REGISTERS=in_registers,
        num_warps=num_warps,
        num_stages=num_stages,
    )
