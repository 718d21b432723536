"""FP8 weights times a few rows of activations: the decode-time FP8 GEMM, weight-only.

At decode a batch has a handful of rows and the GEMM is bound by reading the weights, so
FP8 should halve its time. `torch._scaled_mm` does not get there at such shapes: its
kernels are tiled for large M, and each call first quantizes the activations (a kernel
of its own). This kernel reads the e4m3 weights once, converts them in registers to the
activations' dtype and multiplies with the activations as they are (no activation
quantization: w8a16), accumulating in float32, then applies the per-output-channel scale
and the bias:

    out[m, n] = (sum_k x[m, k] * q[n, k]) * scale[n] + bias[n]

One program per block of BLOCK_N output columns and slice of K; the rows share each
weight tile, so the weights are read once whatever the row count. Two ways to multiply a
tile, chosen per shape (`LaunchConfig.variant`, measured by the sweep):
  dot   `tl.dot` on 16 rows (missing rows masked to zero): the tensor cores, but a 16-row
        operand whatever the batch
  gemv  the tile upcast to float32, multiplied by the broadcast rows and summed along K
        (no tensor cores, no row padding: the kernel is compiled per power-of-two row
        count), for the 11-42 us GEMMs where issuing loads, not math, is the work
Weight scales come per output channel (applied once, after the K loop) or per row and
128 input columns (`quantization/fp8_scales.py`: applied inside the K loop, to each
tile's partial sum when a K tile lies in one group, else to the upcast tile before the
multiply).

Reading weights at the memory's rate takes many bytes in flight on every SM: a few
programs per SM, each with several tiles loading. A shape with few column blocks (o and
down at 4096 columns) splits K (SPLIT_K > 1): each slice writes its float32 partial sums
to a workspace [SPLIT_K, M, N] and a second kernel adds the slices in a fixed order, then
scales, adds the bias and casts, so the output's bits do not depend on which slice ends
first (no atomics). SPLIT_K = 1 is one kernel and no workspace. A persistent launch
(`LaunchConfig.programs_per_sm` > 0) starts that many programs per SM, each looping over
(column block, K slice) tiles, so the last wave of a shape whose tile count is not a
multiple of the SMs does not leave most SMs idle, and no program pays a launch.

The launch configuration comes per shape from `ROW_CONFIGS` (a shape at a bucket of row
counts) or `CONFIGS` (the shape at any row count), both measured by `python -m
bench.fp8_gemm --sweep`, else it is `MEASURED`, the single-kernel config measured before
the sweep existed.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl

from radixmesh.worker.layers.quantization.fp8_scales import GROUP_K

# Rows this kernel serves: a decode batch up to this size takes it, larger ones the GEMM.
MAX_ROWS = 16
# The rows `tl.dot` takes at least; the dot variant's x tile always has this many.
BLOCK_M = 16
VARIANTS = ("dot", "gemv")
# The H100 / H200's SMs, for persistent grids (the device's own count where it runs).
DEFAULT_SMS = 132


def _power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


@dataclass(frozen=True)
class LaunchConfig:
    """How one shape is launched: column block, K tile, K slices, warps, pipeline depth,
    how a tile is multiplied (`VARIANTS`), and programs per SM of a persistent grid (0:
    one program per tile)."""

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    variant: str = "dot"
    programs_per_sm: int = 0

    def __post_init__(self) -> None:
        for field in ("block_n", "block_k", "num_warps"):
            value = getattr(self, field)
            if not _power_of_two(value):
                raise ValueError(f"{field} must be a power of two, got {value}")
        if self.block_n < 16 or self.block_k < 16:  # tl.dot's smallest operand
            raise ValueError(f"block_n and block_k must be >= 16, got {self}")
        if self.split_k < 1 or self.num_stages < 1:
            raise ValueError(f"split_k and num_stages must be >= 1, got {self}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.programs_per_sm < 0:
            raise ValueError(f"programs_per_sm must be >= 0, got {self.programs_per_sm}")

    def shared_bytes(self) -> int:
        """Shared memory the pipelined tiles take (upper estimate): each stage holds a
        weight tile (1 byte an element) and a 16-row 16-bit activation tile."""
        return self.num_stages * self.block_k * (self.block_n + 2 * BLOCK_M)

    def entry(self) -> str:
        """This config as Python source, as `CONFIGS` spells its values (the variant and
        the persistent grid only where they are not the defaults)."""
        values = asdict(self)
        for name, default in (("variant", "dot"), ("programs_per_sm", 0)):
            if values[name] == default:
                del values[name]
        fields = ", ".join(f"{k}={v!r}" for k, v in values.items())
        return f"LaunchConfig({fields})"


# The config every shape takes unless `CONFIGS` names it: the one measured on an H200
# (2026-12-01, `bench.fp8_gemm`: Llama-3-8B's qkv 14.9, o 11.0, gate/up 44.1, down
# 34.3 us at 1-16 rows, as fast as bf16 but not faster). A table entry replaces it only
# once measured on a GPU: the gemv variant, persistent grids and group scales compile and
# pass the interpreter's tests, but a kernel that failed to compile there would take FP8
# decoding down for every model.
MEASURED = LaunchConfig(block_n=32, block_k=256, split_k=1, num_warps=4, num_stages=4)

# (out features n, in features k) -> config, from `python -m bench.fp8_gemm --sweep` on an
# H200: its "best" lines paste here. Llama-3-8B's four GEMMs, swept 2026-12-01 (dot variant
# only, per-channel scales, weights cold in L2, CUDA graphs; us at 1/4/16 rows against
# bf16 F.linear in the same run): each compiled and passed the error check on the H200.
CONFIGS: dict[tuple[int, int], LaunchConfig] = {
    # qkv: 13.8/13.8/14.0 us, 1.82 TB/s, 0.89/0.95/0.93x bf16
    (6144, 4096): LaunchConfig(block_n=64, block_k=128, split_k=8, num_warps=4, num_stages=3),
    # o: 11.1/11.1/11.2 us, 1.51 TB/s, 0.87/0.88/0.88x bf16
    (4096, 4096): LaunchConfig(block_n=32, block_k=128, split_k=8, num_warps=4, num_stages=3),
    # gate_up: 42.1/42.1/42.3 us, 2.79 TB/s, 0.77/0.77/0.76x bf16
    (28672, 4096): LaunchConfig(block_n=32, block_k=256, split_k=1, num_warps=4, num_stages=3),
    # down: 24.6/24.7/24.9 us, 2.39 TB/s, 0.80/0.80/0.79x bf16
    (4096, 14336): LaunchConfig(block_n=32, block_k=256, split_k=8, num_warps=4, num_stages=3),
}
# Row-count buckets the sweep times and `ROW_CONFIGS` keys: a batch of t rows takes the
# smallest bucket >= t (1; 2-4; 5-16).
ROW_BUCKETS = (1, 4, MAX_ROWS)
# (n, k, bucket) -> config, where the sweep found a config faster on that bucket than the
# shape's `CONFIGS` entry (the gemv variant at one row, say). Empty: the 2026-12-02 sweep
# of every variant (fp8_gemm-sweep-h200.json) found none faster than `CONFIGS` at any
# row bucket of Llama-3-8B's shapes (gemv 0.2-1.2 TB/s, persistent grids 5-15% slower).
ROW_CONFIGS: dict[tuple[int, int, int], LaunchConfig] = {}

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


def row_bucket(rows: int) -> int:
    return next(b for b in ROW_BUCKETS if rows <= b)


def config_for(n: int, k: int, rows: int = MAX_ROWS) -> LaunchConfig:
    """The shape's config at `rows` rows: its bucket's, else the shape's, else MEASURED."""
    by_rows = ROW_CONFIGS.get((n, k, row_bucket(rows)))
    return by_rows or CONFIGS.get((n, k), MEASURED)


@triton.jit
def _tile_sum(
    X,
    W,
    Scale,
    m,
    n,
    k,
    k_lo,
    k_hi,
    offs_n,
    stride_x,
    stride_w,
    stride_s,
    IEEE: tl.constexpr,
    EVEN_K: tl.constexpr,
    GEMV: tl.constexpr,
    GROUP_K: tl.constexpr,  # 0: per-channel scales (applied by the caller), else 128
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """sum over k in [k_lo, k_hi) of x[:, k] * w[offs_n, k] (times its group's scale),
    float32 [BLOCK_M, BLOCK_N]; rows >= m and columns >= n come out as zeros."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_m < m
    col_ok = offs_n < n
    x_ptrs = X + offs_m[:, None] * stride_x + offs_k[None, :]
    w_ptrs = W + offs_n.to(tl.int64)[:, None] * stride_w + offs_k[None, :]
    s_ptrs = Scale + offs_n.to(tl.int64) * stride_s
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs + k0, mask=row_ok[:, None], other=0.0)
            w = tl.load(w_ptrs + k0, mask=col_ok[:, None], other=0.0)
        else:
            k_ok = k0 + offs_k < k
            x = tl.load(x_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if GROUP_K == 0 or GROUP_K >= BLOCK_K:
            wt = w  # scaled after the multiply (a tile lies in one group) or never
        else:  # several groups a tile: scale the upcast tile, group by group
            groups = k0 // GROUP_K + tl.arange(0, BLOCK_K // GROUP_K)
            s = tl.load(
                s_ptrs[:, None] + groups[None, :],
                mask=col_ok[:, None] & (groups < tl.cdiv(k, GROUP_K))[None, :],
                other=0.0,
            )
            wt = tl.reshape(w.to(tl.float32), (BLOCK_N, BLOCK_K // GROUP_K, GROUP_K))
            wt = tl.reshape(wt * s[:, :, None], (BLOCK_N, BLOCK_K))
        if GEMV:
            part = tl.sum(x.to(tl.float32)[:, None, :] * wt.to(tl.float32)[None, :, :], axis=2)
        elif IEEE:  # float32 activations: exact float32 products, not tf32
            part = tl.dot(x, tl.trans(wt.to(x.dtype)), input_precision="ieee")
        else:
            part = tl.dot(x, tl.trans(wt.to(x.dtype)))
        if GROUP_K >= BLOCK_K:  # the tile's one group scale, on its partial sums
            s = tl.load(s_ptrs + k0 // GROUP_K, mask=col_ok, other=0.0)
            part = part * s[None, :]
        acc += part
    return acc


# Not specialized on the row count (one compiled kernel for 1-16 rows of the dot variant;
# the gemv variant compiles per BLOCK_M); k_slice is, on its multiple of 16, which tells the
# compiler every slice's start is aligned for wide loads.
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
    k_slice,  # K columns a program's slice covers: a multiple of BLOCK_K (and of GROUP_K)
    n_blocks,
    tiles,  # n_blocks * SPLIT_K
    stride_x,
    stride_w,
    stride_s,
    stride_out,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    PARTIAL: tl.constexpr,
    EVEN_K: tl.constexpr,  # k % BLOCK_K == 0: no K masks, unpredicated wide loads
    GEMV: tl.constexpr,
    GROUP_K: tl.constexpr,
    PERSISTENT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # Tile t: column block t % n_blocks, K slice t // n_blocks. A persistent program takes
    # tiles pid, pid + programs, ...; otherwise each program is one tile.
    if PERSISTENT:
        for t in range(tl.program_id(0), tiles, tl.num_programs(0)):
            _one_tile(
                X, W, Scale, Bias, Out, m, n, k, k_slice, n_blocks, t, stride_x, stride_w,
                stride_s, stride_out, HAS_BIAS, IEEE, PARTIAL, EVEN_K, GEMV, GROUP_K,
                BLOCK_M, BLOCK_N, BLOCK_K,
            )  # fmt: skip
    else:
        _one_tile(
            X, W, Scale, Bias, Out, m, n, k, k_slice, n_blocks, tl.program_id(0), stride_x,
            stride_w, stride_s, stride_out, HAS_BIAS, IEEE, PARTIAL, EVEN_K, GEMV, GROUP_K,
            BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip


@triton.jit
def _one_tile(
    X,
    W,
    Scale,
    Bias,
    Out,
    m,
    n,
    k,
    k_slice,
    n_blocks,
    t,
    stride_x,
    stride_w,
    stride_s,
    stride_out,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    PARTIAL: tl.constexpr,
    EVEN_K: tl.constexpr,
    GEMV: tl.constexpr,
    GROUP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Tile t's sums, stored: scaled, biased and cast into Out, or as slice t // n_blocks's
    float32 partial sums into the workspace."""
    offs_n = (t % n_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = (t // n_blocks) * k_slice
    k_hi = tl.minimum(k_lo + k_slice, k)
    acc = _tile_sum(
        X, W, Scale, m, n, k, k_lo, k_hi, offs_n, stride_x, stride_w, stride_s,
        IEEE, EVEN_K, GEMV, GROUP_K, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    offs_m = tl.arange(0, BLOCK_M)
    col_ok = offs_n < n
    ok = (offs_m < m)[:, None] & col_ok[None, :]
    if PARTIAL:
        part = Out + (t // n_blocks) * m * n + offs_m[:, None] * n + offs_n[None, :]
        tl.store(part, acc, mask=ok)
    else:
        if GROUP_K == 0:
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
    SCALED: tl.constexpr,  # per-channel scales, applied here (group scales already were)
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
    if SCALED:
        acc = acc * tl.load(Scale + col, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(Bias + col, mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + (offs // n) * stride_out + col, acc.to(Out.dtype.element_ty), mask=ok)


SUM_BLOCK = 1024


@functools.cache
def _sms(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def sm_count(device: torch.device) -> int:
    """The device's SMs (DEFAULT_SMS off CUDA: the interpreter's persistent grids)."""
    return _sms(device.index or 0) if device.type == "cuda" else DEFAULT_SMS


def fp8_small_m_linear(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    config: LaunchConfig | None = None,
) -> torch.Tensor:
    """x [T, in] (T <= MAX_ROWS, unit column stride) times e4m3 q [out, in] with float32
    scales, per row [out] or per row and 128 input columns [out, ceil(in/128)] (+ bias
    [out]) -> [T, out] in x's dtype. `config` overrides the shape's launch configuration
    (`config_for`)."""
    t, k = x.shape
    n = q.shape[0]
    assert t <= MAX_ROWS and x.stride(1) == 1 and q.stride(1) == 1, (x.shape, x.stride())
    group_k = GROUP_K if scale.dim() == 2 else 0
    assert scale.shape[0] == n and scale.stride(-1) == 1, (scale.shape, scale.stride())
    assert not group_k or scale.shape[1] == triton.cdiv(k, group_k), (scale.shape, k)
    out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t == 0 or n == 0:
        return out
    cfg = config or config_for(n, k, t)
    # Whole tiles (and groups) per slice, so only the last slice meets the end of K.
    unit = max(cfg.block_k, group_k)
    k_slice = triton.cdiv(triton.cdiv(k, cfg.split_k), unit) * unit
    partial = cfg.split_k > 1
    dest = (
        torch.empty((cfg.split_k, t, n), dtype=torch.float32, device=x.device) if partial else out
    )
    bias_arg = bias if bias is not None else scale  # unused without HAS_BIAS
    gemv = cfg.variant == "gemv"
    n_blocks = triton.cdiv(n, cfg.block_n)
    tiles = n_blocks * cfg.split_k
    programs = tiles
    if cfg.programs_per_sm:
        programs = min(tiles, cfg.programs_per_sm * sm_count(x.device))
    _fp8_small_m_kernel[(programs,)](
        x,
        q,
        scale,
        bias_arg,
        dest,
        t,
        n,
        k,
        k_slice,
        n_blocks,
        tiles,
        x.stride(0),
        q.stride(0),
        scale.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32,
        PARTIAL=partial,
        EVEN_K=k % cfg.block_k == 0,
        GEMV=gemv,
        GROUP_K=group_k,
        PERSISTENT=programs < tiles,
        BLOCK_M=triton.next_power_of_2(t) if gemv else BLOCK_M,
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
            SCALED=not group_k,
            HAS_BIAS=bias is not None,
            BLOCK=SUM_BLOCK,
            num_warps=4,
        )
    return out
