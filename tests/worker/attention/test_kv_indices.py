"""The slot-table flattening kernel against its PyTorch reference (CPU through
TRITON_INTERPRET=1, or CUDA): rows in any order, lengths across the kernel's chunk size."""

from __future__ import annotations

import torch
import triton  # noqa: F401  (a dev dependency: missing must fail, not skip)

from radixmesh.worker.attention.kernels.kv_indices import (
    BLOCK,
    build_kv_indices,
    build_kv_indices_ref,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_matches_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    table = torch.randint(0, 1 << 20, (12, 3 * BLOCK), generator=gen)
    rows = [7, 0, 11, 3, 7]  # a row twice: two sequences may share a table row's prefix
    lens = [1, BLOCK, 2 * BLOCK + 5, 17, 3 * BLOCK]
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    dev = torch.device(DEVICE)
    out = torch.full((int(indptr[-1]) + 9,), -1, dtype=torch.int32, device=dev)
    build_kv_indices(
        table.to(dev),
        torch.tensor(rows, device=dev),
        torch.tensor(lens, device=dev),
        indptr.to(dev),
        out,
    )
    want = build_kv_indices_ref(table, rows, lens)
    assert torch.equal(out[: int(indptr[-1])].cpu(), want)
    assert torch.equal(out[int(indptr[-1]) :].cpu(), torch.full((9,), -1, dtype=torch.int32))
    assert want[:1].tolist() == [int(table[7, 0])]


def test_empty_batch_writes_nothing() -> None:
    out = torch.full((3,), -1, dtype=torch.int32, device=DEVICE)
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    table = torch.zeros((1, 4), dtype=torch.int64, device=DEVICE)
    zero = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    build_kv_indices(table, empty, empty, zero, out)
    assert out.tolist() == [-1, -1, -1]
    assert build_kv_indices_ref(table, [], []).numel() == 0


def test_suffixes_from_start_columns() -> None:
    table = torch.arange(4 * 3 * BLOCK).reshape(4, 3 * BLOCK)
    rows, lens, starts = [2, 0, 3], [BLOCK + 7, 5, 2 * BLOCK], [BLOCK - 1, 4, 3]
    n = [end - s for end, s in zip(lens, starts, strict=True)]
    indptr = torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)
    dev = torch.device(DEVICE)
    out = torch.full((int(indptr[-1]),), -1, dtype=torch.int32, device=dev)
    build_kv_indices(
        table.to(dev),
        torch.tensor(rows, device=dev),
        torch.tensor(lens, device=dev),
        indptr.to(dev),
        out,
        starts=torch.tensor(starts, device=dev),
    )
    want = build_kv_indices_ref(table, rows, lens, starts)
    assert torch.equal(out.cpu(), want)
    assert want[:2].tolist() == [2 * 3 * BLOCK + BLOCK - 1, 2 * 3 * BLOCK + BLOCK]
