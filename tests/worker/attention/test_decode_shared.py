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
    chunk_lists,
    decode_attention_shared,
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
) -> torch.Tensor:
    groups = plan_cascade(c["table"].cpu().numpy(), rows, lens)
    assert groups is not None
    chunks = prefix_chunks(groups, lens, per_chunk, lambda t: t.to(DEVICE))
    assert chunks is not None
    out = torch.full_like(c["q"], float("nan"))
    decode_attention_shared(
        c["q"], c["k"] if k is None else k, c["v"] if v is None else v, out, c["table"],
        ints(rows), ints(lens), c["q"].shape[-1] ** -0.5, chunks, prefix_splits, own_splits,
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
    order, offsets, prefixes, starts = chunk_lists(groups, lens, 3)
    assert order == [4, 0, 2, 6, 5, 3]  # the lone row 1 is in no chunk
    assert offsets == [0, 3, 4, 6]  # the group of 4 cut into 3 + 1
    assert prefixes == [30, 30, 12]
    assert starts == [30, 0, 30, 12, 30, 12, 30]
    chunks = prefix_chunks(groups, lens, 3, lambda t: t)
    assert chunks is not None and chunks.num_chunks == 3 and chunks.max_prefix == 30
    # One packed copy, sliced: each tensor holds its list.
    assert chunks.rows.tolist() == order and chunks.offsets.tolist() == offsets
    assert chunks.prefix_lens.tolist() == prefixes and chunks.starts.tolist() == starts
    assert chunks.max_own == 35  # row 1, alone, reads all its keys as its own
    alone = CascadeGroups(order=[0, 1], sizes=[1, 1], prefix_lens=[5, 6], saved_fraction=0.3)
    assert prefix_chunks(alone, [6, 7], 3, lambda t: t) is None


def test_rows_per_chunk_fill_a_64_row_tile() -> None:
    assert [rows_per_chunk(g) for g in (1, 2, 4, 6, 8, 16, 64, 128)] == [64, 32, 16, 8, 8, 4, 1, 1]
