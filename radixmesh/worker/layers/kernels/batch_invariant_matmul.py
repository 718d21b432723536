"""A batch-invariant matmul for deterministic mode on CUDA: y = x W^T (+ b).

cuBLAS picks its kernel (tile shape, split-K, stream-K) by the problem's M, so a row's
sums come out in another order when the batch grows. Here the tile configuration is a
function of (N, K) and the dtype only (`config`), split count included, and a row's
result is defined, for that configuration, as

    y = round(((((0 + p_0) + p_1) + ... + p_{S-1}) + b)   in float32,

where K is cut into S slices of L = K/S rounded up to BLOCK_K (the last one shorter) and
p_s is the tile's tl.dot accumulation over slice s, from zero, in BLOCK_K steps. Nothing
in that definition names M or where a row sits, so a row's result is the same bits
whatever the batch.

Two kernels compute exactly that definition, and `linear` picks one by M:
- the split kernel (few tiles, decode): one program per (tile, slice) writes p_s in
  float32 to a workspace [S, M, N]; a second kernel sums the S partials in order
  s = 0..S-1 from zero, adds the bias, rounds. S times the programs of an unsplit matmul,
  so a decode step's 64 tiles fill an H200's 132 SMs.
- the inline kernel (many tiles, prefill): persistent (min(SMs, tiles) programs walk the
  tiles in order, tile t to program t mod P, grouped GROUP_M row-tiles at a time so that
  consecutive programs share W's column tiles in L2); per tile, total = 0, then for each
  slice in order acc = 0, loop the slice, total += acc; then + bias, round. No workspace,
  no second launch.
Choosing between them by M is allowed precisely because they give the same bits: the same
BLOCK_K steps from the same slice starts, each slice's accumulation from zero, the same
float32 additions of the S partials in the same order, then the bias, then one rounding.
Both take BLOCK_M/BLOCK_N/BLOCK_K and the warp count from the one MatmulConfig: those set
the tl.dot instruction shapes (and so how the products inside a BLOCK_K step are summed),
which must be the same in both for the partials to be the same bits. num_stages and the
tile walk only schedule loads and programs, never the arithmetic.

Float32 inputs take IEEE products (no TF32), so they match torch's float32 reference to
rounding; bf16/fp16 inputs use the tensor cores with float32 accumulation.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Literal

import torch
import triton
import triton.language as tl

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The programs the default split count aims for at a 256-row decode step: twice an H200's
# 132 SMs (a constant, not the device's count, so that the split stays a function of
# (N, K) only and the bits are the same on every GPU of a deployment).
TARGET_PROGRAMS = 2 * 132
MAX_SPLIT_K = 8
# Fewest BLOCK_K steps per slice the default rule leaves: shorter slices spend more on
# writing and re-reading partials than they gain in parallelism.
MIN_STEPS_PER_SLICE = 4
# The split kernel's workspace is S x M x N float32: `linear` takes it while the tiles
# number below this many per SM (decode sizes), the inline kernel past it.
SPLIT_TILES_PER_SM = 2

Path = Literal["auto", "split", "inline"]


@dataclass(frozen=True)
class MatmulConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    # K slices summed in order (module docstring); 1 = K looped from 0, never split. A
    # default so that tables written before the field existed still load.
    split_k: int = 1


# (N, K) -> the configuration measured best for half types on an H200 by
# `python -m bench.deterministic_matmul` (decode and prefill row counts weighed together).
# Shapes it does not name take the rule in `config`. Llama-3-8B's four GEMMs, 2026-12-02
# (deterministic_matmul-h200.json: 256-row and 8,192-row time weighed 256:17 against
# cuBLAS in the same run; the split and inline paths bit-identical on every candidate):
_WIDE = {
    "block_m": 128,
    "block_n": 256,
    "block_k": 64,
    "group_m": 8,
    "num_warps": 8,
    "num_stages": 3,
}
TABLE: dict[tuple[int, int], MatmulConfig] = {
    (6144, 4096): MatmulConfig(**_WIDE, split_k=2),  # qkv: 1.60x cuBLAS
    (4096, 4096): MatmulConfig(**_WIDE, split_k=2),  # o: 1.72x
    (28672, 4096): MatmulConfig(**_WIDE, split_k=1),  # gate_up: 1.24x
    (4096, 14336): MatmulConfig(**_WIDE, split_k=4),  # down: 1.37x (1.94x unsplit)
}
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


def default_split_k(n: int, k: int, block_m: int, block_n: int, block_k: int) -> int:
    """S for (N, K): enough slices that a 256-row step's tiles times S reach
    TARGET_PROGRAMS, at most MAX_SPLIT_K, and at least MIN_STEPS_PER_SLICE BLOCK_K steps
    per slice. Wide outputs (gate_up's 224 column tiles) stay at 1."""
    tiles = triton.cdiv(n, block_n) * triton.cdiv(256, block_m)
    s = max(1, min(MAX_SPLIT_K, round(TARGET_PROGRAMS / tiles)))
    return max(1, min(s, triton.cdiv(k, block_k) // MIN_STEPS_PER_SLICE))


def config(n: int, k: int, dtype: torch.dtype) -> MatmulConfig:
    """The one configuration for (N, K, dtype): never a function of M. Half types take
    TABLE's entry where it has one; else 128x128x64 tiles with 8 warps (the shape
    cuBLAS-class kernels use on Hopper for large M); narrower N tiles for narrow outputs;
    float32 halves K (twice the bytes); split_k by `default_split_k`."""
    if dtype != torch.float32:
        measured = _table(os.environ.get(TABLE_ENV)).get((n, k))
        if measured is not None:
            return measured
    block_n = 128 if n >= 128 else max(16, triton.next_power_of_2(n))
    block_k = 64 if dtype != torch.float32 else 32
    if k < block_k:
        block_k = max(16, triton.next_power_of_2(k))
    split = default_split_k(n, k, 128, block_n, block_k)
    return MatmulConfig(128, block_n, block_k, 8, 8 if block_n >= 128 else 4, 3, split)


def slices(k: int, cfg: MatmulConfig) -> tuple[int, int]:
    """(slice length, slice count) for K: the length K/split_k rounded up to BLOCK_K, the
    count the slices that length leaves non-empty (at most split_k)."""
    if cfg.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {cfg.split_k}")
    length = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    return length, triton.cdiv(k, length)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@triton.jit
def _tile_of(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Tile index -> (row tile, column tile), GROUP_M row tiles per column sweep."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    group_size = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_size, (tile % per_group) // group_size


@triton.jit
def _slice_dot(
    X,
    W,
    offs_m,
    offs_n,
    m_mask,
    n_mask,
    k_start,
    k_end,
    stride_xm,
    stride_wn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    """p_s: one tile's float32 accumulation over K [k_start, k_end) from zero, in BLOCK_K
    steps. Both kernels call this, so their partials are the same code."""
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = X + offs_m.to(tl.int64)[:, None] * stride_xm + (k_start + offs_k)[None, :]
    w_ptrs = W + offs_n.to(tl.int64)[None, :] * stride_wn + (k_start + offs_k)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k_mask = offs_k + k0 < k_end
        x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)  # [K, N]
        if IEEE:  # noqa: SIM108 (a constexpr branch: one compiled path)
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc


@triton.jit
def _inline_kernel(
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
    slice_len,
    num_slices,
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
    for tile in range(pid, tiles_m * tiles_n, num_programs):
        tile_m, tile_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)
        offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_mask = offs_m < M
        n_mask = offs_n < N
        total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for s in range(0, num_slices):
            k_start = s * slice_len
            k_end = tl.minimum(k_start + slice_len, K)
            total += _slice_dot(
                X, W, offs_m, offs_n, m_mask, n_mask, k_start, k_end, stride_xm, stride_wn,
                BLOCK_M, BLOCK_N, BLOCK_K, IEEE,
            )  # fmt: skip
        if HAS_BIAS:
            total += tl.load(B + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        y_ptrs = Y + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _split_kernel(
    X,
    W,
    P,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    slice_len,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Program (tile, s) writes p_s to P[s] (float32 [S, M, N], contiguous)."""
    tile = tl.program_id(0)
    s = tl.program_id(1)
    tile_m, tile_n = _tile_of(tile, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_start = s * slice_len
    k_end = tl.minimum(k_start + slice_len, K)
    acc = _slice_dot(
        X, W, offs_m, offs_n, m_mask, n_mask, k_start, k_end, stride_xm, stride_wn,
        BLOCK_M, BLOCK_N, BLOCK_K, IEEE,
    )  # fmt: skip
    p_ptrs = P + s.to(tl.int64) * M * N + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(p_ptrs, acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _reduce_kernel(
    P,
    B,
    Y,
    M,
    N,
    stride_ym,
    num_slices,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Y = round((0 + P[0] + P[1] + ... + P[S-1]) + b), the additions in that order."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    total = tl.zeros([BLOCK], tl.float32)
    p_ptrs = P + offs
    for _ in range(0, num_slices):
        total += tl.load(p_ptrs, mask=mask, other=0.0)
        p_ptrs += M * N
    row = offs // N
    col = offs % N
    if HAS_BIAS:
        total += tl.load(B + col, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_ym + col, total.to(Y.dtype.element_ty), mask=mask)


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
    path: Path = "auto",
) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T (+ bias [N]) -> [M, N] in x's dtype. `cfg` and
    `num_programs` (the inline kernel's persistent programs; also the SM count `auto`
    weighs) override the defaults (tests: small tiles in the interpreter). `path` forces a
    kernel (tests, the bench); `auto` takes the split kernel when the config splits K and
    the tiles number fewer than SPLIT_TILES_PER_SM per SM. Either path gives the same bits
    (module docstring)."""
    assert supports(x, weight), (x.shape, x.dtype, weight.shape, weight.dtype)
    if path not in ("auto", "split", "inline"):
        raise ValueError(f"path must be 'auto', 'split' or 'inline', got {path!r}")
    x = x if x.stride(1) == 1 else x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    c = cfg or config(n, k, x.dtype)
    slice_len, num_slices = slices(k, c)
    tiles = triton.cdiv(m, c.block_m) * triton.cdiv(n, c.block_n)
    if num_programs is None:
        num_programs = _num_sms(x.device.index or 0) if x.is_cuda else 4
    if path == "auto":
        split = num_slices > 1 and tiles < SPLIT_TILES_PER_SM * num_programs
        path = "split" if split else "inline"
    b = bias if bias is not None else y
    ieee = x.dtype == torch.float32
    if path == "split":
        partials = torch.empty((num_slices, m, n), dtype=torch.float32, device=x.device)
        _split_kernel[(tiles, num_slices)](
            x, weight, partials, m, n, k, x.stride(0), weight.stride(0), slice_len,
            BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
            IEEE=ieee, num_warps=c.num_warps, num_stages=c.num_stages,
        )  # fmt: skip
        block = 1024
        _reduce_kernel[(triton.cdiv(m * n, block),)](
            partials, b, y, m, n, y.stride(0), num_slices,
            BLOCK=block, HAS_BIAS=bias is not None, num_warps=4,
        )  # fmt: skip
        return y
    programs = max(1, min(num_programs, tiles))
    _inline_kernel[(programs,)](
        x, weight, b, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0), programs,
        slice_len, num_slices,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
        HAS_BIAS=bias is not None, IEEE=ieee, num_warps=c.num_warps, num_stages=c.num_stages,
    )  # fmt: skip
    return y
