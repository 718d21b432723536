"""Decode over shared prefixes (kernels/decode_shared.py) against the float64 reference and
the flat decode kernel, in Triton's interpreter on CPU (float32, float16, an FP8 pool) or
on CUDA: groups of rows whose table rows hold the same slots for a prefix, lone rows
beside them, groups cut into several chunks, prefixes cut into several splits."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.attention.kernels.decode_attention import (
    DecodeConfig,
    decode_attention,
    decode_attention_ref,
    decode_workspace,
)
from radixmesh.worker.attention.kernels.decode_shared import (
    ChunkLayout,
    chunk_lists,
    chunk_views,
    decode_attention_fused,
    decode_attention_shared,
    pack_chunks,
    prefix_chunks,
    rows_per_chunk,
)
from radixmesh.worker.attention.shared_prefix import CascadeGroups, plan_cascade
from radixmesh.worker.kvcache.fp8_kv import dequantize_kv, quantize_kv
from tests.worker.attention.test_triton_kernels import ATTN_DTYPES, DEVICE, TOL, ints, rel_err

# 16-key tiles: the short prefixes still cross tiles and fill several splits.
TILES = DecodeConfig(block_n=16, num_warps=4, num_stages=2)
# (prefix length, own lengths of its rows) per group; a group of one row is a lone row.
Layout = list[tuple[int, list[int]]]


def shared_case(
    layout: Layout, hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int
) -> tuple[dict, list[int], list[int]]:
    """A pool and slot table where each group's rows hold the same slots for its prefix
    and slots of their own after it; rows interleaved across groups in the batch."""
    gen = torch.Generator().manual_seed(seed)
    rows_of = [(p, own) for p, owns in layout for own in owns]
    total = sum(p for p, _ in layout) + sum(o for _, owns in layout for o in owns)
    num_slots = total + 8
    perm = (torch.randperm(num_slots - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(rows_of) + 2, 256, dtype=torch.int64)
    batch_rows = torch.randperm(len(rows_of) + 2, generator=gen)[: len(rows_of)].tolist()
    seq_lens: list[int] = []
    i = 0
    for prefix, owns in layout:
        shared = [perm.pop() for _ in range(prefix)]
        for own in owns:
            slots = shared + [perm.pop() for _ in range(own)]
            table[batch_rows[i], : len(slots)] = torch.tensor(slots)
            seq_lens.append(len(slots))
            i += 1
    # Interleave: the batch's order is not the groups' order.
    order = torch.randperm(len(rows_of), generator=gen).tolist()
    batch_rows = [batch_rows[j] for j in order]
    seq_lens = [seq_lens[j] for j in order]
    k = torch.randn(num_slots, hkv, d, generator=gen).to(DEVICE, dtype)
    v = torch.randn(num_slots, hkv, d, generator=gen).to(DEVICE, dtype)
    q = torch.randn(len(rows_of), hq, d, generator=gen).to(DEVICE, dtype)
    return {"k": k, "v": v, "q": q, "table": table.to(DEVICE)}, batch_rows, seq_lens


def run_shared(
    c: dict,
    rows: list[int],
    lens: list[int],
    per_chunk: int,
    prefix_splits: int,
    own_splits: int,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    scales: tuple | None = None,
    room: ChunkLayout | None = None,
) -> torch.Tensor:
    """The shared-prefix decode of the case; `room`: the chunks packed into that (larger)
    layout with a grid of its size, as a CUDA graph launches them, and the prefix's
    workspace splits twice the step's."""
    groups = plan_cascade(c["table"].cpu().numpy(), rows, lens)
    assert groups is not None
    lists = chunk_lists(groups, lens, per_chunk)
    assert lists is not None
    if room is None:
        chunks = prefix_chunks(lists, prefix_splits, per_chunk, lambda t: t.to(DEVICE))
    else:
        packed = pack_chunks(lists, prefix_splits, room).to(DEVICE)
        chunks = chunk_views(packed, room, per_chunk, 2 * prefix_splits, room.items)
    out = torch.full_like(c["q"], float("nan"))
    decode_attention_shared(
        c["q"], c["k"] if k is None else k, c["v"] if v is None else v, out, c["table"],
        ints(rows), ints(lens), c["q"].shape[-1] ** -0.5, chunks, own_splits,
        scales=scales, config=TILES,
    )  # fmt: skip
    assert not out.isnan().any()
    return out


CASES = [
    # one group of 9 rows over a 40-token prefix, cut into chunks of 4
    ("one-group", [(40, [1, 3, 7, 1, 20, 2, 5, 1, 9])], 4, 2, 16, 4, 2, 2),
    # two groups and lone rows; prefixes longer than a tile, several prefix splits
    ("groups-and-lone", [(70, [2, 5, 1, 4]), (33, [6, 1]), (0, [50]), (0, [9])], 8, 2, 16, 8, 3, 1),
    # MQA, head dim padded
    ("mqa", [(21, [1, 1, 4, 2, 8, 3, 2, 1])], 4, 1, 24, 3, 1, 3),
]


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_the_reference_and_the_flat_kernel(case: tuple, dtype: torch.dtype) -> None:
    _, layout, hq, hkv, d, per_chunk, prefix_splits, own_splits = case
    c, rows, lens = shared_case(layout, hq, hkv, d, dtype, seed=len(lens_of(layout)))
    out = run_shared(c, rows, lens, per_chunk, prefix_splits, own_splits)
    ref = decode_attention_ref(c["q"], c["k"], c["v"], c["table"], rows, lens, d**-0.5)
    assert rel_err(out, ref) < TOL[dtype]
    flat = torch.full_like(c["q"], float("nan"))
    decode_attention(
        c["q"], c["k"], c["v"], flat, c["table"], ints(rows), ints(lens), d**-0.5, 2,
        decode_workspace(len(rows), hq, d, 2, c["q"].device),
    )  # fmt: skip
    assert rel_err(out, flat) < TOL[dtype]


@pytest.mark.parametrize("case", CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_a_graphs_room_gives_the_same_result(case: tuple) -> None:
    """Chunks packed into more room than the step needs (a CUDA graph's: programs past the
    step's items exit, prefix splits past its count stay empty) give the exact-size
    launch's result: the same splits of the same keys, merged with empty ones between
    (only the merge's float32 sum order may differ)."""
    _, layout, hq, hkv, d, per_chunk, prefix_splits, own_splits = case
    c, rows, lens = shared_case(layout, hq, hkv, d, torch.float32, seed=len(lens_of(layout)))
    exact = run_shared(c, rows, lens, per_chunk, prefix_splits, own_splits)
    b = len(rows)
    room = ChunkLayout(b, b, 3 * b)
    roomy = run_shared(c, rows, lens, per_chunk, prefix_splits, own_splits, room=room)
    assert (roomy - exact).abs().max() < 1e-6


def test_no_chunks_is_the_flat_kernel() -> None:
    """A graph's step without sharing: no items, every row from key 0 (the flat kernel's
    work through the shared launches)."""
    layout = [(40, [1, 3, 7, 1]), (0, [12])]
    c, rows, lens = shared_case(layout, 8, 2, 16, torch.float32, seed=2)
    room = ChunkLayout(len(rows), len(rows), 16)
    chunks = chunk_views(pack_chunks(None, 3, room).to(DEVICE), room, 4, 3, room.items)
    assert chunks.counts.tolist() == [0, 3] and chunks.starts.tolist() == [0] * len(rows)
    out = torch.full_like(c["q"], float("nan"))
    decode_attention_shared(
        c["q"], c["k"], c["v"], out, c["table"], ints(rows), ints(lens), 16**-0.5, chunks, 2,
        config=TILES,
    )  # fmt: skip
    ref = decode_attention_ref(c["q"], c["k"], c["v"], c["table"], rows, lens, 16**-0.5)
    assert rel_err(out, ref) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", ATTN_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("room", [False, True], ids=["exact", "graph-room"])
def test_fused_matches_the_reference(case: tuple, dtype: torch.dtype, room: bool) -> None:
    """The one-launch kernel (every row in a chunk, lone rows in chunks of their own over
    no prefix, each row's own keys seen by its query rows only) against the reference,
    packed exactly or into a graph's larger room."""
    _, layout, hq, hkv, d, per_chunk, _, _ = case
    c, rows, lens = shared_case(layout, hq, hkv, d, dtype, seed=len(lens_of(layout)))
    groups = plan_cascade(c["table"].cpu().numpy(), rows, lens)
    lists = chunk_lists(groups, lens, per_chunk, lone=True)
    assert lists is not None and sorted(lists.order) == list(range(len(rows)))
    if room:
        b = len(rows)
        layout_ = ChunkLayout(b + 3, b + 3, b + 3)
        packed = pack_chunks(lists, 1, layout_).to(DEVICE)
        chunks = chunk_views(packed, layout_, per_chunk, 1, layout_.items)
        q = torch.cat([c["q"], c["q"][:3]])  # padded rows: a graph's, table row 0
        rows_, lens_ = [*rows, 0, 0, 0], [*lens, 1, 1, 1]
    else:
        chunks = prefix_chunks(lists, 1, per_chunk, lambda t: t.to(DEVICE))
        q, rows_, lens_ = c["q"], rows, lens
    out = torch.full_like(q, float("nan"))
    decode_attention_fused(
        q, c["k"], c["v"], out, c["table"], ints(rows_), ints(lens_), d**-0.5, chunks,
        config=TILES,
    )  # fmt: skip
    out = out[: len(rows)]
    assert not out.isnan().any()
    ref = decode_attention_ref(c["q"], c["k"], c["v"], c["table"], rows, lens, d**-0.5)
    assert rel_err(out, ref) < TOL[dtype]


def test_fused_with_no_group_reads_every_row_alone() -> None:
    layout = [(0, [12]), (0, [30]), (0, [7])]
    c, rows, lens = shared_case(layout, 8, 2, 16, torch.float32, seed=4)
    lists = chunk_lists(None, lens, 4, lone=True)
    assert lists is not None and lists.prefix_lens == [0, 0, 0]
    assert chunk_lists(None, lens, 4) is None  # the unfused kernels: nothing to chunk
    chunks = prefix_chunks(lists, 1, 4, lambda t: t.to(DEVICE))
    out = torch.full_like(c["q"], float("nan"))
    decode_attention_fused(
        c["q"], c["k"], c["v"], out, c["table"], ints(rows), ints(lens), 16**-0.5, chunks,
        config=TILES,
    )  # fmt: skip
    ref = decode_attention_ref(c["q"], c["k"], c["v"], c["table"], rows, lens, 16**-0.5)
    assert rel_err(out, ref) < TOL[torch.float32]


def lens_of(layout: Layout) -> list[int]:
    return [p + o for p, owns in layout for o in owns]


def test_over_an_fp8_pool() -> None:
    """The FP8 pool's conversion path (16-bit queries: fp16 products, exponents on the
    scores and weights) against the reference over the pool's dequantized values."""
    layout = [(40, [1, 3, 7, 1, 20, 2, 4]), (0, [12])]
    c, rows, lens = shared_case(layout, 4, 2, 16, torch.float16, seed=5)
    (k8, ke), (v8, ve) = quantize_kv(c["k"]), quantize_kv(c["v"])
    out = run_shared(c, rows, lens, 2, 2, 1, k=k8, v=v8, scales=(ke, ve))
    k_ref, v_ref = dequantize_kv(k8, ke, torch.float32), dequantize_kv(v8, ve, torch.float32)
    ref = decode_attention_ref(c["q"], k_ref, v_ref, c["table"], rows, lens, 16**-0.5)
    assert rel_err(out, ref) < TOL[torch.float16]


def test_chunks_of_the_groups() -> None:
    groups = CascadeGroups(
        order=[4, 0, 2, 6, 1, 5, 3], sizes=[4, 1, 2], prefix_lens=[30, 9, 12], saved_fraction=0.5
    )
    lens = [40, 35, 31, 20, 33, 14, 32]
    lists = chunk_lists(groups, lens, 3)
    assert lists is not None
    order, offsets, prefixes, starts = lists.order, lists.offsets, lists.prefix_lens, lists.starts
    assert order == [4, 0, 2, 6, 5, 3]  # the lone row 1 is in no chunk
    assert offsets == [0, 3, 4, 6]  # the group of 4 cut into 3 + 1
    assert prefixes == [30, 30, 12]
    assert starts == [30, 0, 30, 12, 30, 12, 30]
    assert lists.num_chunks == 3
    chunks = prefix_chunks(lists, 2, 3, lambda t: t)
    # One packed copy, viewed: each tensor holds its list; two splits a chunk. The rows
    # have room for the batch (the lone row is in no chunk).
    assert chunks.rows.tolist() == [*order, 0] and chunks.offsets.tolist() == offsets
    assert chunks.prefix_lens.tolist() == prefixes and chunks.starts.tolist() == starts
    assert chunks.items.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]]
    assert chunks.counts.tolist() == [6, 2] and chunks.grid == 6 and chunks.max_splits == 2
    # A graph's room: the same lists at fixed places, the rest zero.
    room = ChunkLayout(batch=8, chunks=5, items=10)
    roomy = chunk_views(pack_chunks(lists, 2, room), room, 3, 4, room.items)
    assert roomy.rows.tolist() == [*order, 0, 0] and roomy.starts.tolist() == [*starts, 0]
    assert roomy.offsets.tolist() == [*offsets, 0, 0] and roomy.items.shape == (10, 2)
    assert roomy.counts.tolist() == [6, 2] and roomy.packed.numel() == room.size
    alone = CascadeGroups(order=[0, 1], sizes=[1, 1], prefix_lens=[5, 6], saved_fraction=0.3)
    assert chunk_lists(alone, [6, 7], 3) is None


def test_rows_per_chunk_fill_a_64_row_tile() -> None:
    assert [rows_per_chunk(g) for g in (1, 2, 4, 6, 8, 16, 64, 128)] == [64, 32, 16, 8, 8, 4, 1, 1]
