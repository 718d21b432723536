"""Decode attention over shared prefixes: the rows of a decode batch that share a cached
prefix read it once per chunk of rows, not once per row.

The radix cache gives every request that matches a tree node the node's KV slots, so a
batch decoding many requests behind one system prompt or document holds that prefix once
in the pool and reads it once per row: 256 rows over a 1,536-token prefix read 1.6 GB of
bf16 KV a step for 6.3 MB of distinct data. On the H200 the flat decode kernel still runs
at the L2's speed there (6.6-7.0 TB/s effective, docs/performance.md, "FlashInfer"), but
the reads stay 256 x the data. Here (the SGLang paper's sharing carried into the kernel):

1. `_prefix_kernel`, one program per (chunk, split) item and KV head: a chunk is up to
   `ROWS` rows of one group (attention/shared_prefix.py finds the groups in the slot
   table's host mirror); their G query heads each, ROWS x G query rows (64 for
   Llama-3-8B's 4 heads a KV head: a full tile for the matrix unit), attend to the
   group's shared keys, read once through the first row's table row. Each row's partial
   output and log2-sum-exp go to workspace splits [0, max_splits); rows in no chunk, and
   splits past the step's count, keep the -inf written before.
2. The flat kernel (decode_attention.py's stage 1) over each row's own keys, from its
   chunk's prefix length on (0 for a row in no chunk), into splits [max_splits, ...).
3. The flat kernel's merge over all the splits.

The chunks, the items and their counts live in one packed device tensor (`ChunkLayout`),
so a CUDA graph holds the three launches at a batch size's room and each replay runs the
chunks packed into it before (the triton backend's `before_replay`); a step without
chunks runs the flat kernel's work through the same graph (no items, every row from key 0).

The arithmetic per key is the flat kernel's (the same loop, `_attend`), over an FP8 pool
too (the Triton conversion path); the split boundaries differ, so the results are the
flat kernel's up to float32 rounding. Not for deterministic mode (its decode rows run the
extend kernel).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixmesh.worker.attention.kernels.decode_attention import (
    LOG2E,
    DecodeConfig,
    _attend,
    _attend_more,
    _decode_split,
    _shift_q,
    _store_partial,
    decode_config,
    decode_workspace,
    max_shared_memory,
    merge_splits,
)
from radixmesh.worker.attention.kernels.decode_split import key_range
from radixmesh.worker.attention.shared_prefix import CascadeGroups

QUERY_ROWS = 64  # a chunk's query rows (rows x query heads a KV head): one matrix-unit tile
MAX_QUERY_ROWS = 128  # what a launch takes (two tiles: bench.attention_backends' sweep)


def rows_per_chunk(group: int) -> int:
    """Batch rows in a chunk for `group` query heads a KV head: QUERY_ROWS query rows."""
    return max(1, QUERY_ROWS // triton.next_power_of_2(group))


@dataclass(frozen=True)
class ChunkLists:
    """A decode batch's shared prefixes as chunks of rows (host lists)."""

    order: list[int]  # batch indices, each chunk's rows consecutive
    offsets: list[int]  # [C + 1] into order
    prefix_lens: list[int]  # [C] keys a chunk's rows share, from position 0
    starts: list[int]  # [B] each row's first own key: its chunk's prefix, or 0

    @property
    def num_chunks(self) -> int:
        return len(self.prefix_lens)


def chunk_lists(
    groups: CascadeGroups | None, seq_lens: list[int], rows: int, lone: bool = False
) -> ChunkLists | None:
    """The chunks: each group of two rows or more cut into chunks of at most `rows` rows;
    a lone row reads its keys alone (start 0), in no chunk, or with `lone` (the fused
    kernel, which reads every row's keys) in a chunk of its own with no shared prefix.
    None when no chunk holds two rows and `lone` is off; `groups` None: every row alone."""
    if groups is None:
        n = len(seq_lens)
        groups = CascadeGroups(list(range(n)), [1] * n, [0] * n, 0.0)
    order: list[int] = []
    offsets = [0]
    prefixes: list[int] = []
    starts = [0] * len(seq_lens)
    shared = False
    at = 0
    for size, prefix in zip(groups.sizes, groups.prefix_lens, strict=True):
        members = groups.order[at : at + size]
        at += size
        if size < 2 or prefix < 1:
            if lone:  # each alone: a chunk of one row over no prefix
                for i in members:
                    order.append(i)
                    offsets.append(len(order))
                    prefixes.append(0)
            continue
        shared = True
        for first in range(0, size, rows):
            chunk = members[first : first + rows]
            order += chunk
            offsets.append(len(order))
            prefixes.append(prefix)
            for i in chunk:
                starts[i] = prefix
    return ChunkLists(order, offsets, prefixes, starts) if shared or lone else None


@dataclass(frozen=True)
class ChunkLayout:
    """Room for the chunk lists in one packed int64 tensor: `batch` rows (the chunks' rows,
    each row's start), `chunks` chunks, `items` (chunk, split) programs, then the counts
    (items, splits). An eager step packs to its own sizes; a CUDA graph packs every step
    into its batch size's room, so the addresses and the grid stay the captured ones."""

    batch: int
    chunks: int
    items: int

    @property
    def size(self) -> int:
        return 2 * self.batch + 2 * self.chunks + 1 + 2 * self.items + 2


def pack_chunks(lists: ChunkLists | None, splits: int, layout: ChunkLayout) -> torch.Tensor:
    """The host tensor of `layout` for `lists` (None: no chunk, every row from key 0), each
    chunk's prefix cut into `splits` splits: one (chunk, split) item per program."""
    packed = torch.zeros(layout.size, dtype=torch.int64)
    b, c = layout.batch, layout.chunks
    if lists is not None:
        n, rows = lists.num_chunks, len(lists.order)
        assert n <= c and rows <= b and len(lists.starts) <= b and n * splits <= layout.items
        packed[:rows] = torch.tensor(lists.order)
        packed[b : b + n + 1] = torch.tensor(lists.offsets)
        packed[b + c + 1 : b + c + 1 + n] = torch.tensor(lists.prefix_lens)
        at = b + 2 * c + 1
        packed[at : at + len(lists.starts)] = torch.tensor(lists.starts)
        at += b
        items = torch.arange(n * splits)
        pairs = torch.stack((items // splits, items % splits), 1)  # (chunk, split)
        packed[at : at + 2 * n * splits] = pairs.flatten()
        packed[-2:] = torch.tensor([n * splits, splits])
    else:
        packed[-2:] = torch.tensor([0, max(1, splits)])
    return packed


@dataclass(frozen=True)
class PrefixChunks:
    """The chunk lists on the device (views into one packed tensor, `ChunkLayout`)."""

    packed: torch.Tensor  # [layout.size]
    rows: torch.Tensor  # [batch] batch indices, each chunk's rows consecutive
    offsets: torch.Tensor  # [chunks + 1] into rows
    prefix_lens: torch.Tensor  # [chunks]
    starts: torch.Tensor  # [batch] each row's first own key
    items: torch.Tensor  # [items, 2] (chunk, split) of each prefix program
    counts: torch.Tensor  # [2] items in use, splits a chunk's prefix is cut into
    rows_per_chunk: int
    grid: int  # prefix programs launched a KV head; those past the items in use exit
    max_splits: int  # workspace splits [0, max_splits) are the prefix's


def chunk_views(
    packed: torch.Tensor, layout: ChunkLayout, rows_per_chunk: int, max_splits: int, grid: int
) -> PrefixChunks:
    b, c, i = layout.batch, layout.chunks, layout.items
    at = b + 2 * c + 1
    return PrefixChunks(
        packed=packed,
        rows=packed[:b],
        offsets=packed[b : b + c + 1],
        prefix_lens=packed[b + c + 1 : at],
        starts=packed[at : at + b],
        items=packed[at + b : at + b + 2 * i].view(i, 2),
        counts=packed[-2:],
        rows_per_chunk=rows_per_chunk,
        grid=grid,
        max_splits=max_splits,
    )


def prefix_chunks(
    lists: ChunkLists,
    splits: int,
    rows: int,
    move: Callable[[torch.Tensor], torch.Tensor],
) -> PrefixChunks:
    """An eager step's chunks on the device, sized to `lists`: one host tensor moved by
    `move` (the backend's copy through pinned memory, which does not wait for the step in
    flight), viewed there."""
    layout = ChunkLayout(len(lists.starts), lists.num_chunks, lists.num_chunks * splits)
    packed = move(pack_chunks(lists, splits, layout))
    return chunk_views(packed, layout, rows, splits, layout.items)


@triton.jit
def _chunk(
    chunk,
    kv_head,
    Q,
    req_to_token,
    req_rows,
    Chunk_rows,
    Chunk_offsets,
    Chunk_prefix,
    stride_qt,
    stride_qh,
    stride_table,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """A chunk's place and its query rows for one KV head: query row r is the chunk's row
    r // GROUP_P2, query head g = r % GROUP_P2 of the KV head. Returns (first, rows in
    the chunk, shared prefix, the first row's table row (the shared keys' slots are the
    same in every member's: the first's), q [R, D], batch rows [R], heads [R], member [R],
    row mask [R], offs_d, d_mask)."""
    first = tl.load(Chunk_offsets + chunk)
    n = (tl.load(Chunk_offsets + chunk + 1) - first).to(tl.int32)
    prefix = tl.load(Chunk_prefix + chunk).to(tl.int32)
    offs_r = tl.arange(0, ROWS * GROUP_P2)
    member = offs_r // GROUP_P2
    g = offs_r % GROUP_P2
    row_mask = (member < n) & (g < GROUP)
    rows = tl.load(Chunk_rows + first + member, mask=member < n, other=0)  # [R] batch rows
    table_row = req_to_token + tl.load(req_rows + tl.load(Chunk_rows + first)) * stride_table
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_ptrs = Q + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [R, D]
    return first, n, prefix, table_row, q, rows, heads, member, row_mask, offs_d, d_mask


@triton.jit
def _prefix_kernel(
    Q,
    K_buf,
    V_buf,
    K_scale,
    V_scale,
    Mid_O,
    Mid_L,
    req_to_token,
    req_rows,
    Chunk_rows,
    Chunk_offsets,
    Chunk_prefix,
    Items,
    Counts,
    scale_log2,
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
    GROUP_P2: tl.constexpr,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
    F16: tl.constexpr,
):
    item = tl.program_id(0)
    if item >= tl.load(Counts):  # a graph's room past this step's items
        return
    chunk = tl.load(Items + 2 * item)
    split = tl.load(Items + 2 * item + 1).to(tl.int32)
    num_splits = tl.load(Counts + 1).to(tl.int32)
    kv_head = tl.program_id(1)
    _, _, prefix, table_row, q, rows, heads, _, row_mask, offs_d, d_mask = _chunk(
        chunk, kv_head, Q, req_to_token, req_rows, Chunk_rows, Chunk_offsets, Chunk_prefix,
        stride_qt, stride_qh, stride_table, GROUP, GROUP_P2, ROWS, HEAD_DIM, BLOCK_D,
    )  # fmt: skip
    lo, hi = key_range(0, prefix, split, num_splits, BLOCK_N)
    q, q_scale = _shift_q(q, scale_log2, ROWS * GROUP_P2, F16)
    acc, l_i, m_i = _attend(
        q, q_scale, table_row, lo, hi, K_buf, V_buf, K_scale, V_scale, kv_head, offs_d,
        d_mask, stride_buf_slot, stride_buf_head, stride_scale_slot, ROWS * GROUP_P2,
        BLOCK_D, BLOCK_N, IEEE, KV_FP8, F16,
    )  # fmt: skip
    mid = rows * stride_mid_b + heads * stride_mid_h + split * stride_mid_s
    _store_partial(Mid_O, Mid_L, mid, acc, l_i, m_i, row_mask, offs_d, d_mask, stride_mid_s)


def _launch_shape(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    out: torch.Tensor,
    chunks: PrefixChunks,
) -> tuple[int, int, int, int, int]:
    """The chunk kernels' shapes, checked: (KV heads, query heads a KV head, that as a
    power of two, batch rows a chunk's tile holds (>= 16 query rows for the matrix unit;
    padding rows are masked out), the head dim's tile)."""
    _, hq, d = q.shape
    hkv = k_buf.shape[1]
    group = hq // hkv
    assert hq % hkv == 0 and k_buf.shape[2] == d and out.shape == q.shape
    assert q.stride(2) == out.stride(2) == k_buf.stride(2) == 1 and v_buf.stride() == k_buf.stride()
    group_p2 = triton.next_power_of_2(group)
    assert chunks.rows_per_chunk * group_p2 <= max(MAX_QUERY_ROWS, 16)
    rows = max(chunks.rows_per_chunk, -(-16 // group_p2))
    return hkv, group, group_p2, rows, max(16, triton.next_power_of_2(d))


def decode_attention_shared(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    chunks: PrefixChunks,
    own_splits: int,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """`decode_attention` (same arguments, same result up to rounding) with the rows of
    `chunks` reading their shared prefixes once per chunk. `workspace`: `decode_workspace`
    with chunks.max_splits + own_splits splits (allocated if None). `config`: the flat
    kernel's tiles (Triton, `decode_config` by default; the CUDA FP8 kernel is not used
    here). Launches depend on the shapes and `chunks`' room only, not on what it holds:
    a CUDA graph captures them once and each replay runs the chunks packed in then."""
    b, hq, d = q.shape
    hkv, group, group_p2, rows, block_d = _launch_shape(q, k_buf, v_buf, out, chunks)
    prefix_splits = chunks.max_splits
    assert prefix_splits >= 1 and own_splits >= 1 and chunks.starts.shape == (b,)
    k_scale, v_scale = scales if scales is not None else (k_buf, v_buf)
    if b == 0:
        return out
    splits = prefix_splits + own_splits
    if workspace is None:
        workspace = decode_workspace(b, hq, d, splits, q.device)
    mid_o, mid_l = workspace
    assert mid_o.shape == (b, hq, splits, d) and mid_l.shape == (b, hq, splits)
    cfg = config or decode_config(block_d, q.element_size(), max_shared_memory(q.device))
    kv_fp8 = scales is not None
    f16 = kv_fp8 and q.dtype != torch.float32
    mid_l[:, :, :prefix_splits].fill_(float("-inf"))  # rows in no chunk: no prefix part
    _prefix_kernel[(chunks.grid, hkv)](
        q,
        k_buf,
        v_buf,
        k_scale,
        v_scale,
        mid_o,
        mid_l,
        req_to_token,
        req_rows,
        chunks.rows,
        chunks.offsets,
        chunks.prefix_lens,
        chunks.items,
        chunks.counts,
        scale * LOG2E,
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
        GROUP_P2=group_p2,
        ROWS=triton.next_power_of_2(rows),
        HEAD_DIM=d,
        BLOCK_D=block_d,
        BLOCK_N=cfg.block_n,
        IEEE=q.dtype == torch.float32,
        KV_FP8=kv_fp8,
        F16=f16,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    _decode_split(
        q, k_buf, v_buf, k_scale, v_scale, workspace, req_to_token, req_rows, seq_lens,
        scale * LOG2E, own_splits, cfg, kv_fp8, starts=chunks.starts, split_base=prefix_splits,
    )  # fmt: skip
    return merge_splits(workspace, out, splits)


@triton.jit
def _fused_kernel(
    Q,
    K_buf,
    V_buf,
    Out,
    req_to_token,
    req_rows,
    seq_lens,
    Chunk_rows,
    Chunk_offsets,
    Chunk_prefix,
    Counts,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_buf_slot,
    stride_buf_head,
    stride_table,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One program per (chunk, KV head) does all of its rows' attention: the shared
    prefix once for the chunk's ROWS x G query rows, then each row's own keys with only
    that row's query rows seeing them, then the output itself (no split, no merge)."""
    chunk = tl.program_id(0)
    if chunk >= tl.load(Counts):  # a graph's room past this step's chunks
        return
    kv_head = tl.program_id(1)
    first, n, prefix, table_row, q, rows, heads, member, row_mask, offs_d, d_mask = _chunk(
        chunk, kv_head, Q, req_to_token, req_rows, Chunk_rows, Chunk_offsets, Chunk_prefix,
        stride_qt, stride_qh, stride_table, GROUP, GROUP_P2, ROWS, HEAD_DIM, BLOCK_D,
    )  # fmt: skip
    q_scale = tl.full([ROWS * GROUP_P2], scale_log2, tl.float32)
    acc, l_i, m_i = _attend(
        q, q_scale, table_row, 0, prefix, K_buf, V_buf, K_buf, V_buf, kv_head, offs_d,
        d_mask, stride_buf_slot, stride_buf_head, 0, ROWS * GROUP_P2, BLOCK_D, BLOCK_N,
        IEEE, False, False,
    )  # fmt: skip
    for r in range(0, n):
        b = tl.load(Chunk_rows + first + r)
        own_row = req_to_token + tl.load(req_rows + b) * stride_table
        end = tl.load(seq_lens + b).to(tl.int32)
        acc, l_i, m_i = _attend_more(
            acc, l_i, m_i, q, q_scale, own_row, prefix, end, member == r, K_buf, V_buf,
            K_buf, V_buf, kv_head, offs_d, d_mask, stride_buf_slot, stride_buf_head, 0,
            ROWS * GROUP_P2, BLOCK_D, BLOCK_N, IEEE, False, False, True,
        )  # fmt: skip
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = Out + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def decode_attention_fused(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    out: torch.Tensor,
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    chunks: PrefixChunks,
    *,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """`decode_attention` (same result up to rounding) in one launch: every row in one of
    `chunks` (`chunk_lists(..., lone=True)`, one split a chunk), each chunk's program
    reading its shared prefix once and each row's own keys, then writing the rows'
    outputs; no workspace, no merge. 16-bit or float32 pools (an FP8 pool takes
    `decode_attention_shared`)."""
    b, _, d = q.shape
    hkv, group, group_p2, rows, block_d = _launch_shape(q, k_buf, v_buf, out, chunks)
    assert k_buf.dtype == q.dtype and chunks.max_splits == 1
    if b == 0:
        return out
    cfg = config or decode_config(block_d, q.element_size(), max_shared_memory(q.device))
    _fused_kernel[(chunks.grid, hkv)](
        q,
        k_buf,
        v_buf,
        out,
        req_to_token,
        req_rows,
        seq_lens,
        chunks.rows,
        chunks.offsets,
        chunks.prefix_lens,
        chunks.counts,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_buf.stride(0),
        k_buf.stride(1),
        req_to_token.stride(0),
        GROUP=group,
        GROUP_P2=group_p2,
        ROWS=triton.next_power_of_2(rows),
        HEAD_DIM=d,
        BLOCK_D=block_d,
        BLOCK_N=cfg.block_n,
        IEEE=q.dtype == torch.float32,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
