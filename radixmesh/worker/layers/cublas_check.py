"""Deterministic mode on CUDA with cuBLAS: zero workspace, then a check per GEMM shape.

cuBLAS picks its kernel by the problem's M; with a workspace it may pick split-K or
stream-K kernels at small M, whose partial sums meet in another order, so a row's bits
change with the batch (on an H200 with torch 2.11: the 4096 x 4096 and 4096 x 14336
GEMMs of Llama-3-8B at M <= 48). Without a workspace (`CUBLAS_WORKSPACE_CONFIG=:0:0`)
those kernels are out of reach, and every kernel it picks loops K in order within the
tile: on the same H200 every row of Llama-3-8B's five GEMMs had the same bits at every M
from 1 to 8,192 (`python -m bench.deterministic_matmul --cublas-check`). That is a
measurement, not a contract: a library or GPU may pick differently. So each shape a
model runs is checked when the engine starts (`rows_invariant`, at the row counts of
`check_rows`) and takes cuBLAS only if every one gave the same bits; any other shape
takes the Triton matmul, which is batch-invariant by construction
(kernels/batch_invariant_matmul.py).

PyTorch reads the workspace size once, at a process's first cuBLAS call: the worker asks
for zero workspace before it touches the GPU (`request_zero_workspace`). An engine built
in a process that already used cuBLAS keeps the workspace it had, and the check then
decides shape by shape as always.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.nn.functional as F

WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
ZERO_WORKSPACE = ":0:0"


def request_zero_workspace() -> None:
    """Zero cuBLAS workspace for this process, unless its environment already set one."""
    os.environ.setdefault(WORKSPACE_ENV, ZERO_WORKSPACE)


def check_rows(max_rows: int) -> list[int]:
    """The row counts a shape is checked at: every count to 64 (where kernels change most
    often), every multiple of 8 to 512, then steps of an eighth up to `max_rows`."""
    ms = set(range(1, min(64, max_rows) + 1)) | set(range(72, min(512, max_rows) + 1, 8))
    m = 512
    while m < max_rows:
        ms.add(m)
        m += max(8, m // 8)
    ms.add(max_rows)
    return sorted(ms)


@torch.inference_mode()
def rows_invariant(
    weight: torch.Tensor, bias: torch.Tensor | None, ms: Iterable[int], seed: int = 0
) -> list[int]:
    """The row counts M at which `F.linear` gave some row other bits than the same row in
    a batch of max(ms) (rows taken from the start and one row in). Empty: invariant at
    every M checked."""
    ms = list(ms)
    top = max(ms)
    gen = torch.Generator(device=weight.device).manual_seed(seed)
    x = torch.randn(top + 1, weight.shape[1], generator=gen, device=weight.device)
    x = x.to(weight.dtype)
    ref = F.linear(x, weight, bias)
    bad = []
    for m in ms:
        if not (
            torch.equal(F.linear(x[:m], weight, bias), ref[:m])
            and torch.equal(F.linear(x[1 : m + 1], weight, bias), ref[1 : m + 1])
        ):
            bad.append(m)
    return bad
