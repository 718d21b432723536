"""The extend kernel as it was before the split into prefix / off-diagonal / diagonal key
ranges (radixmesh 2026-12-01): every key through the slot table, the causal mask on every
tile, 4 warps. Kept here, not in the package, only as the baseline `attention_kernels`
times the current kernel against on the same inputs in one run.

One program per (sequence, KV head, block of new tokens, the group's query heads folded
into its rows) runs an online softmax over key tiles up to the block's last causal key.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from radixmesh.worker.attention.kernels.kv_store import pow2

LOG2E = 1.0 / math.log(2.0)


@triton.jit
def _extend_kernel(
    Q,
    K_buf,
    V_buf,
    K_scale,
    V_scale,
    O,
    req_to_token,
    req_rows,
    prefix_lens,
    extend_lens,
    q_start,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_buf_slot,
    stride_buf_head,
    stride_scale_slot,
    stride_table,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    m_block = tl.program_id(2)
    extend = tl.load(extend_lens + b)
    if m_block * BLOCK_M >= extend:
        return
    prefix = tl.load(prefix_lens + b)
    start = tl.load(q_start + b).to(tl.int64)
    table_row = req_to_token + tl.load(req_rows + b).to(tl.int64) * stride_table

    # The group's query heads are folded into the rows: row r is new token r // GROUP_P2
    # of the block, query head kv_head * GROUP + r % GROUP_P2 (rows past GROUP masked), so
    # each K/V tile is read once for the whole group.
    offs_r = tl.arange(0, BLOCK_M * GROUP_P2)
    offs_m = m_block * BLOCK_M + offs_r // GROUP_P2  # [R] index among the new tokens
    g = offs_r % GROUP_P2
    h = kv_head * GROUP + g
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = (offs_m < extend) & (g < GROUP)
    d_mask = offs_d < HEAD_DIM
    q_ptrs = Q + (start + offs_m)[:, None] * stride_qt + h[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)  # [R, D]
    q_pos = prefix + offs_m  # [R] absolute positions

    # Keys past the block's last query are causally masked for every row of the block.
    key_end = tl.minimum(prefix + extend, prefix + (m_block + 1) * BLOCK_M)
    m_i = tl.full([BLOCK_M * GROUP_P2], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * GROUP_P2], tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_P2, BLOCK_D], tl.float32)
    for n0 in range(0, key_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < key_end
        slots = tl.load(table_row + offs_n, mask=n_mask, other=0).to(tl.int64)  # [N]
        kv_off = slots[:, None] * stride_buf_slot + kv_head * stride_buf_head + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        scale_off = slots * stride_scale_slot + kv_head  # [N] (an FP8 pool's exponents)
        k = tl.load(K_buf + kv_off, mask=kv_mask, other=0.0)  # [N, D]
        if KV_FP8:  # e4m3 times 2^e of its (slot, head): exact in the query's dtype
            k_exp = tl.load(K_scale + scale_off, mask=n_mask, other=0).to(tl.int32)
            k = (k.to(tl.float32) * pow2(k_exp)[:, None]).to(Q.dtype.element_ty)
        if IEEE:  # noqa: SIM108 (a constexpr branch: one compiled path)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale_log2  # [M, N] fp32, in log2 units
        visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        # Every row sees key 0 in the first block, so m_new is finite from there on.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V_buf + kv_off, mask=kv_mask, other=0.0)  # [N, D]
        if KV_FP8:
            v_exp = tl.load(V_scale + scale_off, mask=n_mask, other=0).to(tl.int32)
            v = (v.to(tl.float32) * pow2(v_exp)[:, None]).to(Q.dtype.element_ty)
        if IEEE:  # noqa: SIM108 (a constexpr branch: one compiled path)
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / l_i[:, None]
    o_ptrs = O + (start + offs_m)[:, None] * stride_ot + h[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def extend_attention_before(
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
    block_rows: int = 128,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """q/out [T, Hq, D]; k_buf/v_buf [num_slots, Hkv, D]; per-sequence int tensors [B]
    (`q_start[b]`: sequence b's first row of q); `max_extend` bounds extend_lens."""
    t, hq, d = q.shape
    hkv = k_buf.shape[1]
    b = req_rows.shape[0]
    assert hq % hkv == 0 and k_buf.shape[2] == d and out.shape == q.shape
    assert q.stride(2) == out.stride(2) == k_buf.stride(2) == 1 and v_buf.stride() == k_buf.stride()
    assert req_to_token.stride(1) == 1
    # An FP8 pool: its (k, v) scale exponents [num_slots, Hkv] int8; unused pointers else.
    k_scale, v_scale = scales if scales is not None else (k_buf, v_buf)
    assert scales is None or (k_scale.stride() == v_scale.stride() and k_scale.stride(1) == 1)
    if t == 0 or b == 0:
        return out
    group = hq // hkv
    group_p2 = triton.next_power_of_2(group)
    block_m = max(1, block_rows // group_p2)  # new tokens per program; rows = block_m * group_p2
    grid = (b, hkv, triton.cdiv(max_extend, block_m))
    _extend_kernel[grid](
        q,
        k_buf,
        v_buf,
        k_scale,
        v_scale,
        out,
        req_to_token,
        req_rows,
        prefix_lens,
        extend_lens,
        q_start,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        k_scale.stride(0),
        req_to_token.stride(0),
        GROUP=group,
        GROUP_P2=group_p2,
        HEAD_DIM=d,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32,
        KV_FP8=scales is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
