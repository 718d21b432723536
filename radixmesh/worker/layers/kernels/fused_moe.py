"""A mixture of experts' two projections as grouped GEMMs, with no host sync (layers/moe.py).

The (token, choice) pairs of a step are sorted by expert and each expert's group is padded
to a multiple of BLOCK_M rows (`align`): a block of BLOCK_M sorted rows then belongs to
one expert, and one program per (block, BLOCK_N output columns) multiplies its rows by that
expert's weight. Every size is the worst case of the step's token count (T * k pairs plus
BLOCK_M - 1 padding rows per expert), never the counts themselves, so nothing is read back
to the host and the launches can be captured in a CUDA graph; the blocks past the used ones
exit at once.

- `moe_gemm(a, w, sorted_ids, block_experts, ...)`: rows of `a` (a token's row for each of
  its pairs, or the pairs' own rows) times w[e]^T for the block's expert e, each output
  row written at its pair's index, optionally scaled by the pair's routing weight; float32
  accumulation.
- `fused_experts(x, w13, w2, experts, weights)`: gate/up GEMM, SiLU-and-mul, down GEMM
  with the routing weights, and each token's sum over its k pairs in float32; the tiles
  (`GemmConfig`) from `CONFIGS` by the mean rows an expert gets, which the token count
  (a shape, known on the host) decides.

FP8 weights (weight-only, layers/quantization/fp8_experts.py): w holds e4m3 values and a
`BlockScales` their float32 scales, one per block of bn rows x bk columns. Each weight tile
is converted to the activations' dtype for `tl.dot`; where a block spans K (bk >= K) the
scale of each output column multiplies the accumulator once after the K loop, else each
K step's float32 partial product is scaled by its columns' scales before it is added
(BLOCK_K divides bk, so a step never spans two scale blocks). The activations are never
quantized. A constexpr picks the path: the 16/32-bit weights' code is unchanged.

The PyTorch loop in layers/moe.py (one matmul per expert with tokens) is the reference and
the CPU path; the tests run these kernels in triton's interpreter against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixmesh.worker.layers.kernels.silu_mul import silu_and_mul
from radixmesh.worker.layers.quantization.fp8_experts import MIN_BLOCK_K, BlockScales

BLOCK_M = 16  # align's default: the smallest block, a decode step's


@dataclass(frozen=True)
class GemmConfig:
    """One launch's tiles: rows of sorted pairs per block (each expert's group is padded
    to a multiple of it), output columns and reduction depth per step, warps, stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# By the mean pairs an expert gets in a step (T * k / E): the first whose bound the mean
# is under. Few rows an expert: the weights' bytes bound the step, so narrow column tiles
# and deep steps give more programs and more bytes in flight to read them; many: the
# tiles of a dense GEMM. `python -m bench.moe --sweep` times a grid around these on a GPU
# (docs/performance.md, "Mixture of experts").
CONFIGS: tuple[tuple[float, GemmConfig], ...] = (
    (8, GemmConfig(16, 32, 128, 8, 4)),
    (32, GemmConfig(16, 64, 128, 4, 4)),
    (96, GemmConfig(128, 64, 64, 4, 4)),
    (160, GemmConfig(64, 128, 64, 8, 3)),
    (float("inf"), GemmConfig(128, 128, 64, 8, 3)),
)


def gemm_config(tokens: int, top_k: int, num_experts: int) -> GemmConfig:
    """The table's tiles for a step of `tokens` tokens (known on the host: no sync)."""
    mean = tokens * top_k / num_experts
    return next(config for bound, config in CONFIGS if mean < bound)


def align(
    experts: torch.Tensor, num_experts: int, block_m: int = BLOCK_M
) -> tuple[torch.Tensor, torch.Tensor]:
    """`experts` [T, k] -> (sorted_ids, block_experts): sorted_ids [P] holds the pair
    indices (t * k + j) grouped by expert, each group padded to a multiple of `block_m`
    with the sentinel T * k; block_experts [P / block_m] is each block's expert, -1 past
    the last used block. P is the worst case, T * k + E * (block_m - 1), rounded up."""
    flat = experts.flatten()
    pairs = flat.numel()
    # Not bincount: on CUDA it reads the largest id back to size its output.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first_of_group = torch.cumsum(counts, 0) - counts  # each expert's first sorted pair
    within = torch.arange(pairs, device=flat.device) - first_of_group[sorted_experts]
    dest = (ends - padded)[sorted_experts] + within
    size = triton.cdiv(pairs + num_experts * (block_m - 1), block_m) * block_m
    sorted_ids = torch.full((size,), pairs, dtype=torch.int64, device=flat.device)
    sorted_ids[dest] = order
    starts = torch.arange(0, size, block_m, device=flat.device)
    block_experts = torch.searchsorted(ends, starts, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1)
    return sorted_ids, block_experts


# How the kernel scales its weights: not at all (16/32-bit weights), FP8 with one scale
# per output column after the K loop (a scale block spans K), or per K step.
NO_SCALE, SCALE_AFTER_K, SCALE_PER_K_STEP = 0, 1, 2


@triton.jit
def _moe_gemm_kernel(
    A,
    W,
    Out,
    SortedIds,
    BlockExperts,
    PairWeights,
    WScale,
    num_pairs,
    n,
    k,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    stride_se,
    stride_sn,
    stride_sk,
    TOP_K: tl.constexpr,
    A_BY_TOKEN: tl.constexpr,
    SCALE: tl.constexpr,
    W_SCALE: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(BlockExperts + block)
    if expert < 0:
        return
    pairs = tl.load(SortedIds + block * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM]
    used = pairs < num_pairs
    rows = pairs // TOP_K if A_BY_TOKEN else pairs  # a's row: the pair's token, or itself
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    w_base = W + expert.to(tl.int64) * stride_we
    # FP8 weights: each output column's row of scale blocks.
    s_base = WScale + expert.to(tl.int64) * stride_se + (cols // SCALE_BN) * stride_sn  # [BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            A + rows[:, None].to(tl.int64) * stride_am + ks[None, :],
            mask=used[:, None] & (ks[None, :] < k),
            other=0.0,
        )  # [BM, BK]
        w = tl.load(
            w_base + cols[None, :].to(tl.int64) * stride_wn + ks[:, None],
            mask=(cols[None, :] < n) & (ks[:, None] < k),
            other=0.0,
        )  # [BK, BN]: w[e]^T's tile
        if W_SCALE == 2:  # SCALE_PER_K_STEP: the step lies in one column block
            s = tl.load(s_base + (k0 // SCALE_BK) * stride_sk, mask=cols < n, other=0.0)
            acc += tl.dot(a, w.to(a.dtype), input_precision="ieee") * s[None, :]
        elif W_SCALE == 1:  # SCALE_AFTER_K
            acc = tl.dot(a, w.to(a.dtype), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc, input_precision="ieee")  # float32 models: no tf32
    if W_SCALE == 1:
        acc = acc * tl.load(s_base, mask=cols < n, other=0.0)[None, :]
    if SCALE:
        acc = acc * tl.load(PairWeights + pairs, mask=used, other=0.0)[:, None]
    out = Out + pairs[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out, acc.to(Out.dtype.element_ty), mask=used[:, None] & (cols[None, :] < n))


def _weight_scaling(
    w: torch.Tensor, scales: BlockScales | None, block_k: int
) -> tuple[int, int, int, int]:
    """(W_SCALE, SCALE_BN, SCALE_BK, BLOCK_K) for weights w [E, N, K] with `scales`: the
    largest K step up to `block_k` that divides a column block (on the host, from
    shapes: no sync)."""
    if scales is None:
        return NO_SCALE, 1, 1, block_k
    (e, n, k), (bn, bk) = w.shape, scales.block
    want = (e, triton.cdiv(n, bn), triton.cdiv(k, bk))
    if w.dtype != torch.float8_e4m3fn or tuple(scales.scale.shape) != want:
        raise ValueError(
            f"FP8 weights {tuple(w.shape)} {w.dtype} with blocks {scales.block} need "
            f"float8_e4m3fn and scales {want}, got {tuple(scales.scale.shape)}"
        )
    if bk >= k:
        return SCALE_AFTER_K, bn, bk, block_k
    step = math.gcd(block_k, bk)
    if step < MIN_BLOCK_K:
        raise ValueError(f"scale blocks of {bk} columns: no K step of at least {MIN_BLOCK_K}")
    return SCALE_PER_K_STEP, bn, bk, step


def moe_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_experts: torch.Tensor,
    *,
    top_k: int,
    num_pairs: int,
    a_by_token: bool,
    pair_weights: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: GemmConfig,
    w_scales: BlockScales | None = None,
) -> torch.Tensor:
    """[num_pairs, N]: for each pair p, a[p // top_k if a_by_token else p] @ w[e(p)]^T
    (times pair_weights[p] where given). a: [rows, K] contiguous; w: [E, N, K] contiguous,
    FP8 with `w_scales` (contiguous) or a's dtype; sorted_ids and block_experts from
    `align` with config.block_m (no default: a block size that differs from align's would
    read another expert's rows). With FP8 weights the K step is config.block_k or less,
    a divisor of the scale blocks' columns."""
    n, k = w.shape[1], w.shape[2]
    w_scale, scale_bn, scale_bk, block_k = _weight_scaling(w, w_scales, config.block_k)
    out = torch.empty(num_pairs, n, dtype=out_dtype or a.dtype, device=a.device)
    scale = w_scales.scale if w_scales is not None else out
    grid = (block_experts.numel(), triton.cdiv(n, config.block_n))
    _moe_gemm_kernel[grid](
        a,
        w,
        out,
        sorted_ids,
        block_experts,
        pair_weights if pair_weights is not None else out,
        scale,
        num_pairs,
        n,
        k,
        a.stride(0),
        w.stride(0),
        w.stride(1),
        out.stride(0),
        scale.stride(0) if w_scales is not None else 0,
        scale.stride(1) if w_scales is not None else 0,
        scale.stride(2) if w_scales is not None else 0,
        TOP_K=top_k,
        A_BY_TOKEN=a_by_token,
        SCALE=pair_weights is not None,
        W_SCALE=w_scale,
        SCALE_BN=scale_bn,
        SCALE_BK=scale_bk,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=block_k,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    config: GemmConfig | None = None,
    *,
    scales: tuple[BlockScales, BlockScales] | None = None,
) -> torch.Tensor:
    """The sparse MLP's output [T, H] in x's dtype: x [T, H]; w13 [E, 2I, H] (gate rows,
    then up rows); w2 [E, H, I]; experts [T, k] and their float32 weights [T, k].
    `config`: both GEMMs' tiles (None: `gemm_config`'s for the step). `scales`: FP8
    weights' (w13's, w2's) block scales (None: w13 and w2 in x's dtype)."""
    t, top_k = experts.shape
    pairs = t * top_k
    config = config or gemm_config(t, top_k, w13.shape[0])
    w13_scales, w2_scales = scales if scales is not None else (None, None)
    sorted_ids, block_experts = align(experts, w13.shape[0], config.block_m)
    x = x.contiguous()
    gate_up = moe_gemm(
        x,
        w13,
        sorted_ids,
        block_experts,
        top_k=top_k,
        num_pairs=pairs,
        a_by_token=True,
        config=config,
        w_scales=w13_scales,
    )  # [T * k, 2I]
    down = moe_gemm(
        silu_and_mul(gate_up),
        w2,
        sorted_ids,
        block_experts,
        top_k=top_k,
        num_pairs=pairs,
        a_by_token=False,
        pair_weights=weights.flatten().contiguous(),
        out_dtype=torch.float32,
        config=config,
        w_scales=w2_scales,
    )  # [T * k, H], each pair's output times its weight
    return down.view(t, top_k, -1).sum(dim=1).to(x.dtype)
