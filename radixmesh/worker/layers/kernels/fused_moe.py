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
`BlockScales` their float32 scales, one per block of bn rows x bk columns. Where a block
spans K (bk >= K) each weight tile is converted to the activations' dtype for `tl.dot`
and the scale of each output column multiplies the accumulator once after the K loop;
else each K step's tile is dequantized in registers (e4m3 times its columns' scales in
float32, rounded to the activations' dtype: the numbers of experts dequantized at load)
and the dot accumulates in place (BLOCK_K divides bk, so a step never spans two scale
blocks). Scaling each step's float32 partial product instead, outside the dot's
accumulation, ran Qwen3-30B-A3B's one-token layer at 128 x 128 blocks in 1.11 ms against
0.54 for bf16 weights and 0.60 with per-row scales (H100, `bench.moe --fp8`). A constexpr
picks the path: the 16/32-bit weights' code is unchanged.

FP8 activations too (w8a8, as SGLang and vLLM run block-FP8 experts): each GEMM's input
is quantized on the device (`quantize_activations`, the per-token kernel of
kernels/fp8_quant.py), and `tl.dot` multiplies two e4m3 tiles on the FP8 MMA (Hopper:
twice bf16's rate) into float32. The activations' scales follow the weights' blocks:
under blocks narrower than K (bk < K: 128 x 128, 1 x 128, TP's column blocks) one per
(row, group of bk columns), DeepSeek's 1 x 128, so each K step adds
dot(a8, w8) * a_scale[:, None] * w_scale[None, :]; where a block spans K, one per row
and both scales multiply the accumulator once after the K loop. The gate/up GEMM's
input is quantized once per token, the down GEMM's per pair (SiLU-and-mul's product).
Which path a call takes (`use_fp8_activations`) is decided on the host from shapes: the
row count and the blocks.

The PyTorch loop in layers/moe.py (one matmul per expert with tokens) is the reference and
the CPU path; the tests run these kernels in triton's interpreter against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixmesh.worker.layers.kernels.fp8_quant import per_token_fp8
from radixmesh.worker.layers.kernels.silu_mul import silu_and_mul, silu_and_mul_fp8
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


# The w8a8 path's tiles, 128-deep K steps everywhere: an e4m3 tile of 128 columns is the
# bytes of a 64-column bf16 one (the same shared memory a stage), and a step of 128
# columns is one scale block of a 128 x 128 checkpoint: one scale load and one scaled add
# per block rather than two. Set by `python -m bench.moe --sweep fp8` (one H200,
# 2026-12-06, moe-fp8-sweep-h200.json; 128 x 128 blocks, ms a layer call, bf16's tiles
# with 128-deep steps against these, timed in the same sweep): Mixtral's shape at a mean
# of 4 rows an expert 1.08 against 0.77 (32-column tiles leave the FP8 MMA's loads
# short), at 64 1.14 against 0.96; Qwen3-30B-A3B's at 128 1.07 against 0.98; at 16 and
# 512 bf16's tiles were within 2% of the grid's best and stay.
FP8_CONFIGS: tuple[tuple[float, GemmConfig], ...] = (
    (8, GemmConfig(16, 128, 128, 4, 4)),
    (32, GemmConfig(16, 64, 128, 4, 4)),
    (96, GemmConfig(64, 64, 128, 4, 4)),
    (160, GemmConfig(64, 128, 128, 4, 3)),
    (float("inf"), GemmConfig(128, 128, 128, 8, 3)),
)


def gemm_config(
    tokens: int, top_k: int, num_experts: int, fp8_activations: bool = False
) -> GemmConfig:
    """The table's tiles for a step of `tokens` tokens (known on the host: no sync);
    `fp8_activations`: the w8a8 path's table."""
    mean = tokens * top_k / num_experts
    table = FP8_CONFIGS if fp8_activations else CONFIGS
    return next(config for bound, config in table if mean < bound)


# FP8 weights: the w8a8 path from this mean of rows an expert gets (T * k / E). Below it
# a step mostly reads weights, the same FP8 bytes either way, and weight-only skips
# quantizing the activations; from it the step computes, where the FP8 MMA is twice
# bf16's rate and the weight tile needs no conversion. Set from `python -m bench.moe
# --fp8` (one H100, 2026-12-06, moe-fp8-h100.json; ms a layer call, weight-only against
# w8a8, per-row / 128 x 128 scales): Mixtral's shape at a mean of 4 rows 1.26 / 1.24
# against 1.03 / 1.10, at 64 1.61 / 1.54 against 1.06 / 1.17, at 512 6.11 / 4.82 against
# 2.45 / 3.37; Qwen3-30B-A3B's at 1 row 0.62 / 0.65 against 0.74 / 0.73, at 16 0.67 /
# 0.66 against 0.70 / 0.70 (within the ~15% that repeated calls move), at 128 1.39 /
# 1.39 against 1.01 / 1.17.
W8A8_MIN_MEAN_ROWS = 4.0
# The FP8 MMA's K step: 32 bytes of each operand per instruction (mma m16n8k32, wgmma
# k32), so an activation scale group (a K step) of fewer columns takes weight-only.
MIN_FP8_BLOCK_K = 32


def fp8_activations_fit(k: int, scales: BlockScales) -> bool:
    """Whether a GEMM over K = `k` with weight blocks `scales.block` can take FP8
    activations: its scale blocks span K (one activation scale a row), or split K into
    whole groups of at least MIN_FP8_BLOCK_K columns (the activation groups are the
    blocks' columns, and the quantizer cuts rows into whole groups)."""
    bk = scales.block[1]
    return bk >= k or (k % bk == 0 and bk % MIN_FP8_BLOCK_K == 0)


def use_fp8_activations(
    tokens: int,
    top_k: int,
    w13: torch.Tensor,
    w2: torch.Tensor,
    scales: tuple[BlockScales, BlockScales] | None,
) -> bool:
    """Whether a step of `tokens` tokens takes the w8a8 path: FP8 weights whose blocks fit
    it (`fp8_activations_fit`, both GEMMs) and at least W8A8_MIN_MEAN_ROWS rows an expert
    on average. Shapes only (host, no sync): a captured graph keeps its choice."""
    return _both_fit(w13, w2, scales) and tokens * top_k / w13.shape[0] >= W8A8_MIN_MEAN_ROWS


def _both_fit(
    w13: torch.Tensor, w2: torch.Tensor, scales: tuple[BlockScales, BlockScales] | None
) -> bool:
    """FP8 weights whose blocks both GEMMs can take FP8 activations under."""
    return (
        scales is not None
        and fp8_activations_fit(w13.shape[2], scales[0])
        and fp8_activations_fit(w2.shape[2], scales[1])
    )


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
    AScale,
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
    stride_as,
    TOP_K: tl.constexpr,
    A_BY_TOKEN: tl.constexpr,
    SCALE: tl.constexpr,
    W_SCALE: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    A_FP8: tl.constexpr,
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
    # FP8 activations: each row's scales, one per group of SCALE_BK columns (or one).
    as_base = AScale + rows.to(tl.int64) * stride_as  # [BM]
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
            if A_FP8:  # e4m3 x e4m3 on the FP8 MMA; the step lies in one activation group
                a_s = tl.load(as_base + k0 // SCALE_BK, mask=used, other=0.0)
                acc += tl.dot(a, w) * a_s[:, None] * s[None, :]
            else:  # the tile dequantized in registers, so the dot accumulates in place
                w = (w.to(tl.float32) * s[None, :]).to(a.dtype)
                acc = tl.dot(a, w, acc, input_precision="ieee")
        elif W_SCALE == 1:  # SCALE_AFTER_K
            if A_FP8:
                acc = tl.dot(a, w, acc)
            else:
                acc = tl.dot(a, w.to(a.dtype), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc, input_precision="ieee")  # float32 models: no tf32
    if W_SCALE == 1:
        if A_FP8:
            acc = acc * tl.load(as_base, mask=used, other=0.0)[:, None]
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


def _check_fp8_activations(
    a: torch.Tensor,
    a_scales: torch.Tensor,
    w_scale: int,
    scale_bk: int,
    block_k: int,
    out_dtype: torch.dtype | None,
) -> None:
    """FP8 activations fit the kernel: e4m3 a [rows, K] under FP8 weights, contiguous
    float32 scales [rows, K / bk] (one a row where a weight block spans K), K steps of at
    least MIN_FP8_BLOCK_K, an output dtype (a's is e4m3)."""
    rows, k = a.shape
    groups = 1 if w_scale == SCALE_AFTER_K else triton.cdiv(k, scale_bk)
    if (
        w_scale == NO_SCALE
        or a.dtype != torch.float8_e4m3fn
        or a_scales.dtype != torch.float32
        or tuple(a_scales.shape) != (rows, groups)
        or not a_scales.is_contiguous()
        or out_dtype is None
    ):
        raise ValueError(
            f"FP8 activations {tuple(a.shape)} {a.dtype} need FP8 weights, e4m3 values, "
            f"contiguous float32 scales ({rows}, {groups}) and an out_dtype; got scales "
            f"{tuple(a_scales.shape)} {a_scales.dtype}, out_dtype {out_dtype}"
        )
    if w_scale == SCALE_PER_K_STEP and block_k < MIN_FP8_BLOCK_K:
        raise ValueError(f"FP8 activations: K steps of {block_k} columns, under {MIN_FP8_BLOCK_K}")


def quantize_activations(x: torch.Tensor, scales: BlockScales) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] (contiguous) -> (e4m3 [T, K], float32 scales [T, groups]) for weights of
    blocks `scales.block` (`fp8_activations_fit`): one scale a row where a block spans K,
    else one per row and group of bk columns, each max|group| / 448.

    kernels/fp8_quant.py's per-token kernel quantizes whole rows; a group of bk columns
    is a row of x viewed [T * K / bk, bk] (bk divides K), so the same kernel gives the
    groups, bit for bit `quantize_rows` of that view."""
    t, k = x.shape
    bk = scales.block[1]
    group = k if bk >= k else bk
    if k % group:
        raise ValueError(f"FP8 activations: groups of {group} columns do not divide {k}")
    q, s = per_token_fp8(x.reshape(t * k // group, group))
    return q.view(t, k), s.view(t, k // group)


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
    a_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """[num_pairs, N]: for each pair p, a[p // top_k if a_by_token else p] @ w[e(p)]^T
    (times pair_weights[p] where given). a: [rows, K] contiguous; w: [E, N, K] contiguous,
    FP8 with `w_scales` (contiguous) or a's dtype; sorted_ids and block_experts from
    `align` with config.block_m (no default: a block size that differs from align's would
    read another expert's rows). With FP8 weights the K step is config.block_k or less,
    a divisor of the scale blocks' columns. `a_scales`: a in e4m3 (FP8 weights only) with
    float32 scales [rows, groups] (`quantize_activations` with the weights' blocks), and
    out_dtype given."""
    n, k = w.shape[1], w.shape[2]
    w_scale, scale_bn, scale_bk, block_k = _weight_scaling(w, w_scales, config.block_k)
    if a_scales is not None:
        _check_fp8_activations(a, a_scales, w_scale, scale_bk, block_k, out_dtype)
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
        a_scales if a_scales is not None else out,
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
        a_scales.stride(0) if a_scales is not None else 0,
        TOP_K=top_k,
        A_BY_TOKEN=a_by_token,
        SCALE=pair_weights is not None,
        W_SCALE=w_scale,
        SCALE_BN=scale_bn,
        SCALE_BK=scale_bk,
        A_FP8=a_scales is not None,
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
    fp8_activations: bool | None = None,
) -> torch.Tensor:
    """The sparse MLP's output [T, H] in x's dtype: x [T, H]; w13 [E, 2I, H] (gate rows,
    then up rows); w2 [E, H, I]; experts [T, k] and their float32 weights [T, k].
    `scales`: FP8 weights' (w13's, w2's) block scales (None: w13 and w2 in x's dtype).
    `fp8_activations`: FP8 weights times FP8 activations (w8a8) or times x's dtype
    (weight-only); None: `use_fp8_activations`' choice for the step. `config`: both GEMMs'
    tiles (None: `gemm_config`'s for the step and path)."""
    t, top_k = experts.shape
    pairs = t * top_k
    if fp8_activations is None:
        fp8_activations = use_fp8_activations(t, top_k, w13, w2, scales)
    elif fp8_activations and not _both_fit(w13, w2, scales):
        raise ValueError(f"FP8 activations need FP8 weights whose blocks fit them, got {scales}")
    w13_scales, w2_scales = scales if scales is not None else (None, None)
    w8a8 = scales if fp8_activations else None
    config = config or gemm_config(t, top_k, w13.shape[0], fp8_activations)
    sorted_ids, block_experts = align(experts, w13.shape[0], config.block_m)
    x = x.contiguous()
    a, a_scales = quantize_activations(x, w8a8[0]) if w8a8 is not None else (x, None)
    gate_up = moe_gemm(
        a,  # e4m3 once a token (w8a8), or x
        w13,
        sorted_ids,
        block_experts,
        top_k=top_k,
        num_pairs=pairs,
        a_by_token=True,
        out_dtype=x.dtype,
        config=config,
        w_scales=w13_scales,
        a_scales=a_scales,
    )  # [T * k, 2I]
    h, h_scales = _down_input(gate_up, w8a8[1] if w8a8 is not None else None)
    down = moe_gemm(
        h,
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
        a_scales=h_scales,
    )  # [T * k, H], each pair's output times its weight
    return down.view(t, top_k, -1).sum(dim=1).to(x.dtype)


def _down_input(
    gate_up: torch.Tensor, w2_scales: BlockScales | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SiLU-and-mul of the pairs' [gate | up] [P, 2I]: in gate_up's dtype (None: weight-only
    or 16-bit weights), or quantized for w2's blocks. One scale a pair: silu_and_mul's
    quantizing kernel, one launch. One per group of bk columns: that kernel quantizes a
    whole row (gate and up sit I columns apart, so no view of gate_up cuts a row into
    groups), hence the product first and `quantize_activations` over it."""
    if w2_scales is None:
        return silu_and_mul(gate_up), None
    i = gate_up.shape[1] // 2
    if w2_scales.block[1] >= i:
        q, s = silu_and_mul_fp8(gate_up)
        return q, s[:, None]
    return quantize_activations(silu_and_mul(gate_up), w2_scales)
