"""A batch-invariant matmul for deterministic mode on CUDA: y = x W^T (+ b).

cuBLAS picks its kernel (tile shape, split-K, stream-K) by the problem's M, so a row's
sums come out in another order when the batch grows. Here the tile configuration is a
function of (N, K) and the dtype only (`config`): every output tile is one program's
loop over K from 0 in BLOCK_K steps, accumulated in float32, never split. A row's result
is then the same bits whatever M is and wherever the row sits in x.

Persistent: min(number of SMs, tiles) programs walk the tiles in order (tile t goes to
program t mod P), grouped GROUP_M row-tiles at a time so that consecutive programs share
W's column tiles in L2. The walk changes which program computes a tile, never how.

Float32 inputs take IEEE products (no TF32), so they match torch's float32 reference to
rounding; bf16/fp16 inputs use the tensor cores with float32 accumulation.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class MatmulConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


# (N, K) -> the configuration measured best for half types on an H200 by
# `python -m bench.deterministic_matmul` (decode and prefill row counts weighed together).
# Shapes it does not name take the rule in `config`.
TABLE: dict[tuple[int, int], MatmulConfig] = {}
# A JSON file of the sweep's table ([{"n", "k", <MatmulConfig fields>}, ...]) that
# replaces TABLE for half types: to run an engine on a sweep's choice before pasting it.
TABLE_ENV = "RADIXMESH_DETERMINISTIC_MATMUL_TABLE"


@functools.cache
def _table(path: str | None) -> dict[tuple[int, int], MatmulConfig]:
    if not path:
        return TABLE
    with open(path) as f:
        rows = json.load(f)
    return {(r.pop("n"), r.pop("k")): MatmulConfig(**r) for r in rows}


def config(n: int, k: int, dtype: torch.dtype) -> MatmulConfig:
    """The one configuration for (N, K, dtype): never a function of M. Half types take
    TABLE's entry where it has one; else 128x128x64 tiles with 8 warps (the shape
    cuBLAS-class kernels use on Hopper for large M); narrower N tiles for narrow outputs;
    float32 halves K (twice the bytes)."""
    if dtype != torch.float32:
        measured = _table(os.environ.get(TABLE_ENV)).get((n, k))
        if measured is not None:
            return measured
    block_n = 128 if n >= 128 else max(16, triton.next_power_of_2(n))
    block_k = 64 if dtype != torch.float32 else 32
    if k < block_k:
        block_k = max(16, triton.next_power_of_2(k))
    return MatmulConfig(128, block_n, block_k, 8, 8 if block_n >= 128 else 4, 3)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@triton.jit
def _matmul_kernel(
    X,
    W,
    B,
    Y,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    num_programs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tiles_m * tiles_n
    per_group = GROUP_M * tiles_n
    offs_k = tl.arange(0, BLOCK_K)
    for tile in range(pid, num_tiles, num_programs):
        group = tile // per_group
        first_m = group * GROUP_M
        group_size = tl.minimum(tiles_m - first_m, GROUP_M)
        tile_m = first_m + (tile % per_group) % group_size
        tile_n = (tile % per_group) // group_size
        offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_mask = offs_m < M
        n_mask = offs_n < N
        x_ptrs = X + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
        w_ptrs = W + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_mask = offs_k + k0 < K
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)  # [K, N]
            if IEEE:  # noqa: SIM108 (a constexpr branch: one compiled path)
                acc = tl.dot(x, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(x, w, acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if HAS_BIAS:
            acc += tl.load(B + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        y_ptrs = Y + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` takes these operands: 2-D, one supported dtype, unit inner stride."""
    return (
        x.dim() == 2
        and weight.dim() == 2
        and x.dtype == weight.dtype
        and x.dtype in DTYPES
        and weight.stride(1) == 1
        and x.shape[1] == weight.shape[1]
    )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    cfg: MatmulConfig | None = None,
    num_programs: int | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias [N]) -> [M, N] in x's dtype. `cfg` and
    `num_programs` override the defaults (tests: small tiles in the interpreter)."""
    assert supports(x, weight), (x.shape, x.dtype, weight.shape, weight.dtype)
    x = x if x.stride(1) == 1 else x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    c = cfg or config(n, k, x.dtype)
    tiles = triton.cdiv(m, c.block_m) * triton.cdiv(n, c.block_n)
    if num_programs is None:
        num_programs = _num_sms(x.device.index or 0) if x.is_cuda else 4
    programs = max(1, min(num_programs, tiles))
    _matmul_kernel[(programs,)](
        x,
        weight,
        bias if bias is not None else y,
        y,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        y.stride(0),
        programs,
        BLOCK_M=c.block_m,
        BLOCK_N=c.block_n,
        BLOCK_K=c.block_k,
        GROUP_M=c.group_m,
        HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32,
        num_warps=c.num_warps,
        num_stages=c.num_stages,
    )
    return y
