"""FP8 weights times a few rows of activations: the decode-time FP8 GEMM, weight-only.

At decode a batch has a handful of rows and the GEMM is bound by reading the weights, so
FP8 should halve its time. `torch._scaled_mm` does not get there at such shapes: its
kernels are tiled for large M, and each call first quantizes the activations (a kernel
of its own). This kernel reads the e4m3 weights once, converts them in registers to the
activations' dtype and multiplies with the activations as they are (no activation
quantization: w8a16), accumulating in float32, then applies the per-output-channel scale
and the bias:

    out[m, n] = (sum_k x[m, k] * q[n, k]) * scale[n] + bias[n]

One program per block of BLOCK_N output columns and slice of K; the rows (at most
BLOCK_M) share each weight tile, so the weights are read once whatever the row count.
`tl.dot` needs 16 rows; missing rows are masked to zero.

Reading weights at the memory's rate takes many bytes in flight on every SM: a few
programs per SM, each with several tiles loading. A shape with few column blocks (o and
down at 4096 columns) splits K (SPLIT_K > 1): each slice writes its float32 partial sums
to a workspace [SPLIT_K, M, N] and a second kernel adds the slices in a fixed order, then
scales, adds the bias and casts, so the output's bits do not depend on which slice ends
first (no atomics). SPLIT_K = 1 is one kernel and no workspace. The launch configuration
comes per shape from `CONFIGS` (measured: `python -m bench.fp8_gemm --sweep`), else it is
`MEASURED`, the single-kernel config measured before the sweep existed.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

# Rows this kernel serves: a decode batch up to this size takes it, larger ones the GEMM.
MAX_ROWS = 16
# The rows `tl.dot` takes at least; the x tile in shared memory always has this many.
BLOCK_M = 16


def _power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


@dataclass(frozen=True)
class LaunchConfig:
    """How one shape is launched: column block, K tile, K slices, warps, pipeline depth."""

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        for field in ("block_n", "block_k", "num_warps"):
            value = getattr(self, field)
            if not _power_of_two(value):
                raise ValueError(f"{field} must be a power of two, got {value}")
        if self.block_n < 16 or self.block_k < 16:  # tl.dot's smallest operand
            raise ValueError(f"block_n and block_k must be >= 16, got {self}")
        if self.split_k < 1 or self.num_stages < 1:
            raise ValueError(f"split_k and num_stages must be >= 1, got {self}")

    def shared_bytes(self) -> int:
        """Shared memory the pipelined tiles take (upper estimate): each stage holds a
        weight tile (1 byte an element) and a 16-row 16-bit activation tile."""
        return self.num_stages * self.block_k * (self.block_n + 2 * BLOCK_M)

    def entry(self) -> str:
        """This config as Python source, as `CONFIGS` spells its values."""
        fields = ", ".join(f"{k}={v}" for k, v in asdict(self).items())
        return f"LaunchConfig({fields})"


# The config every shape takes unless `CONFIGS` names it: the one measured on an H200
# (2026-12-01, `bench.fp8_gemm`: Llama-3-8B's qkv 14.9, o 11.0, gate/up 44.1, down
# 34.3 us at 1-16 rows, as fast as bf16 but not faster). A config replaces it only once
# measured: split-K and the other tilings compile and pass the interpreter's tests, but
# none has run on a GPU yet, and a kernel that failed to compile there would take FP8
# decoding down for every model.
MEASURED = LaunchConfig(block_n=32, block_k=256, split_k=1, num_warps=4, num_stages=4)

# (out features n, in features k) -> config, from `python -m bench.fp8_gemm --sweep` on an
# H200: its "best" lines paste here. Empty until that sweep has run.
CONFIGS: dict[tuple[int, int], LaunchConfig] = {}

# What `split_k_guess` aims at: programs per SM, enough weight tiles in flight per SM.
PROGRAMS_PER_SM = 3.5
# A K slice keeps at least this many K tiles, so its pipeline fills before it drains.
MIN_TILES_PER_SLICE = 4
MAX_SPLIT_K = 8


@functools.cache
def split_k_guess(n: int, k: int, sms: int = 132) -> LaunchConfig:
    """The config expected to read weights fastest on (n, k), which the sweep always
    times: 32 columns a program (64 when that alone gives enough programs), and K split
    in 2, 4 or 8 while there are fewer than PROGRAMS_PER_SM programs per SM and each
    slice keeps MIN_TILES_PER_SLICE tiles of 256."""
    target = PROGRAMS_PER_SM * sms
    block_n, block_k = (64 if triton.cdiv(n, 64) >= target else 32), 256
    split_k = 1
    while (
        triton.cdiv(n, block_n) * split_k < target
        and split_k < MAX_SPLIT_K
        and k >= 2 * split_k * MIN_TILES_PER_SLICE * block_k
    ):
        split_k *= 2
    return LaunchConfig(block_n=block_n, block_k=block_k, split_k=split_k)


def config_for(n: int, k: int) -> LaunchConfig:
    return CONFIGS.get((n, k), MEASURED)


# Not specialized on the row count (one compiled kernel for 1-16 rows); k_slice is, on its
# multiple of 16, which tells the compiler every slice's start is aligned for wide loads.
@triton.jit(do_not_specialize=["m"])
def _fp8_small_m_kernel(
    X,
    W,
    Scale,
    Bias,
    Out,  # [M, N] in X's dtype, or the float32 workspace [SPLIT_K, M, N] when PARTIAL
    m,
    n,
    k,
    k_slice,  # K columns a program's slice covers: a multiple of BLOCK_K
    stride_x,
    stride_w,
    stride_out,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    PARTIAL: tl.constexpr,
    EVEN_K: tl.constexpr,  # k % BLOCK_K == 0: no K masks, unpredicated wide loads
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_m < m
    col_ok = offs_n < n
    k_lo = tl.program_id(1) * k_slice
    k_hi = tl.minimum(k_lo + k_slice, k)
    x_ptrs = X + offs_m[:, None] * stride_x + offs_k[None, :]
    w_ptrs = W + offs_n.to(tl.int64)[:, None] * stride_w + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs + k0, mask=row_ok[:, None], other=0.0)
            w = tl.load(w_ptrs + k0, mask=col_ok[:, None], other=0.0)
        else:
            k_ok = k0 + offs_k < k
            x = tl.load(x_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:  # float32 activations: exact float32 products, not tf32
            acc += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    ok = row_ok[:, None] & col_ok[None, :]
    if PARTIAL:
        part = Out + tl.program_id(1) * m * n + offs_m[:, None] * n + offs_n[None, :]
        tl.store(part, acc, mask=ok)
    else:
        acc = acc * tl.load(Scale + offs_n, mask=col_ok, other=0.0)[None, :]
        if HAS_BIAS:
            acc += tl.load(Bias + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        out = Out + offs_m[:, None] * stride_out + offs_n[None, :]
        tl.store(out, acc.to(Out.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["m"])
def _sum_slices_kernel(
    Part,  # float32 [SPLIT_K, M, N]
    Scale,
    Bias,
    Out,
    m,
    n,
    stride_out,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # flat over [M, N]
    size = m * n
    ok = offs < size
    col = offs % n
    acc = tl.load(Part + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):  # slice 0, 1, 2, ...: one order, every run
        acc += tl.load(Part + s * size + offs, mask=ok, other=0.0)
    acc = acc * tl.load(Scale + col, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(Bias + col, mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + (offs // n) * stride_out + col, acc.to(Out.dtype.element_ty), mask=ok)


SUM_BLOCK = 1024


def fp8_small_m_linear(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """x [T, in] (T <= MAX_ROWS, unit column stride) times e4m3 q [out, in] with float32
    per-row scales [out] (+ bias [out]) -> [T, out] in x's dtype. `config` overrides the
    shape's launch configuration (`config_for`)."""
    t, k = x.shape
    n = q.shape[0]
    assert t <= MAX_ROWS and x.stride(1) == 1 and q.stride(1) == 1, (x.shape, x.stride())
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t == 0 or n == 0:
        return out
    cfg = config or config_for(n, k)
    # Whole tiles per slice, so only the last slice meets the end of K (or none does).
    k_slice = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    partial = cfg.split_k > 1
    dest = (
        torch.empty((cfg.split_k, t, n), dtype=torch.float32, device=x.device) if partial else out
    )
    bias_arg = bias if bias is not None else scale  # unused without HAS_BIAS
    _fp8_small_m_kernel[(triton.cdiv(n, cfg.block_n), cfg.split_k)](
        x,
        q,
        scale,
        bias_arg,
        dest,
        t,
        n,
        k,
        k_slice,
        x.stride(0),
        q.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32,
        PARTIAL=partial,
        EVEN_K=k % cfg.block_k == 0,
        BLOCK_M=BLOCK_M,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if partial:
        _sum_slices_kernel[(triton.cdiv(t * n, SUM_BLOCK),)](
            dest,
            scale,
            bias_arg,
            out,
            t,
            n,
            out.stride(0),
            SPLIT_K=cfg.split_k,
            HAS_BIAS=bias is not None,
            BLOCK=SUM_BLOCK,
            num_warps=4,
        )
    return out
