"""How a mixture of experts holds FP8 weights (the grouped GEMMs take them weight-only or
with FP8 activations, layers/kernels/fused_moe.py): e4m3 values [E, N, K] and float32
scales in blocks, [E, ceil(N / bn), ceil(K / bk)] for a block (bn, bk) of bn rows and bk
columns sharing one scale.

Which blocks (`held_blocks`): the checkpoint's own where they fall on whole blocks of
this rank's weights, an FP8 checkpoint's 128 x 128 blocks kept as they are; per output
row (1, K) where the method quantizes per channel ("fp8", "fp8-channel", "fp8-static":
a full-precision weight quantized at load, a checkpoint's per-tensor or per-channel
scales repeated on their rows). Where this rank's part of a weight does not fall on whole
checkpoint blocks, the layout that still holds every scale exactly:
- w13 [E, 2 I, H]: an expert's gate and up are two checkpoint tensors, stacked at rows 0
  and I of this rank (I its share of the intermediate size), and each rank takes rows
  rank * I of both. Unless I is a multiple of the block's rows, a block would mix rows
  of two checkpoint blocks: the scales are held one per row (1, 128), each row its
  block's scale (4 bytes per 128 weight bytes, as the dense FP8 layers hold theirs).
- w2 [E, H, I]: each rank takes columns rank * I. Unless that is a multiple of 128, the
  rank's 128-column groups would straddle two checkpoint groups: the scales are held in
  column blocks of gcd(I, 128), which divides every offset, if the kernel can step
  through K that finely (at least `MIN_BLOCK_K`: Qwen3-30B-A3B's I = 96 at 8 ranks
  gives 32); else the rank's slice is dequantized and quantized again per row at load
  (`requantize_rows`), the one case whose values are not the checkpoint's bits (besides
  block scales handed to experts held per row: code naming another method than the
  checkpoint's own, which the worker never does).

`block_scales` maps a checkpoint's scales (as `fp8_scales.checkpoint_scales`, the one
reader of their layouts, gives them) onto the held blocks and checks that every element
keeps its scale; a checkpoint whose scales a held block cannot carry exactly, and which
is not held per row, is a ValueError rather than a silently different scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixmesh.worker.layers.quantization.fp8_scales import (
    GROUP_K,
    quantize_blocks,
    quantize_rows,
)

# The smallest K step of the grouped GEMM (tl.dot's): column blocks under it are not held.
MIN_BLOCK_K = 16
Block = tuple[int, int]  # (rows, columns) sharing one scale


@dataclass(frozen=True)
class BlockScales:
    """An FP8 weight's [E, N, K] float32 scales [E, ceil(N / bn), ceil(K / bk)] and their
    block (bn, bk): w[e, n, k] ~= q[e, n, k] * scale[e, n // bn, k // bk]."""

    scale: torch.Tensor
    block: Block


def checkpoint_block(method: str) -> Block | None:
    """The scale blocks a quantization method's checkpoints carry (and a full-precision
    weight is quantized to at load): 128 x 128 or 1 x 128; None: per tensor or per
    output channel."""
    return {"fp8-128x128": (128, 128), "fp8-1x128": (1, 128)}.get(method)


def held_blocks(
    checkpoint: Block | None, hidden: int, local_size: int, tp_size: int
) -> tuple[Block, Block]:
    """(w13's block, w2's block) for checkpoint blocks `checkpoint` (None: per channel)
    and this rank's `local_size` of the intermediate size (the module docstring says
    why each fallback)."""
    i = local_size
    if checkpoint is None:
        return (1, hidden), (1, i)
    rows, cols = checkpoint
    w13 = (rows if i % rows == 0 else 1, cols)
    if tp_size == 1 or i % cols == 0:
        return w13, (rows, cols)
    step = math.gcd(i, cols)
    return w13, ((rows, step) if step >= MIN_BLOCK_K else (1, i))


def quantize_checkpoint(
    w: torch.Tensor, checkpoint: Block | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A full-precision checkpoint weight [rows, cols] -> (e4m3, scales as an FP8
    checkpoint of the method would store them): per row ([rows]) or per block
    ([ceil(rows / b), ceil(cols / 128)])."""
    if checkpoint is None:
        return quantize_rows(w)
    return quantize_blocks(w, checkpoint[0])


def element_scales(
    scale: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int], total_cols: int
) -> torch.Tensor:
    """Each element's scale [n, m] in rows [r0, r0 + n) and columns [c0, c0 + m) of a
    checkpoint weight, from `checkpoint_scales`' form of its scales ([rows] or [rows,
    ceil(total_cols / 128)])."""
    (r0, n), (c0, m) = rows, cols
    grid, width = (scale, GROUP_K) if scale.dim() == 2 else (scale[:, None], total_cols)
    groups = torch.arange(c0, c0 + m, device=scale.device) // width
    return grid[r0 : r0 + n][:, groups]


def block_scales(
    scale: torch.Tensor,
    rows: tuple[int, int],
    cols: tuple[int, int],
    total_cols: int,
    block: Block,
) -> torch.Tensor | None:
    """The scales of rows [r0, r0 + n) and columns [c0, c0 + m) of a checkpoint weight in
    blocks of `block`, [ceil(n / bn), ceil(m / bk)]; `scale` as `checkpoint_scales` gives
    it ([rows] or [rows, groups]). None where a block would cover two different scales.

    Checked on column segments, not elements: within a run of columns that neither a
    checkpoint group nor a held block boundary cuts, every column has the same scale."""
    (r0, n), (c0, m) = rows, cols
    bn, bk = block
    width = GROUP_K if scale.dim() == 2 else total_cols
    local = torch.arange(m, device=scale.device)
    theirs, ours = (local + c0) // width, local // bk
    starts = torch.ones(m, dtype=torch.bool, device=scale.device)
    starts[1:] = (theirs[1:] != theirs[:-1]) | (ours[1:] != ours[:-1])
    segments = starts.nonzero()[:, 0]  # [S]: each run's first column
    grid = scale if scale.dim() == 2 else scale[:, None]
    per_segment = grid[r0 : r0 + n][:, theirs[segments]]  # [n, S]
    first = torch.searchsorted(ours[segments], torch.arange(-(-m // bk), device=scale.device))
    blocks = per_segment[::bn][:, first]  # [ceil(n / bn), ceil(m / bk)]
    back = blocks.repeat_interleave(bn, dim=0)[:n][:, ours[segments]]
    return blocks.contiguous() if torch.equal(back, per_segment) else None


def requantize_rows(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 values [n, m] with each element's scale [n, m] -> (e4m3 [n, m], scales [n, 1]),
    quantized again per row from their float32 products."""
    values, row_scales = quantize_rows(q.float() * scales)
    return values, row_scales[:, None]


def expand_blocks(scale: torch.Tensor, block: Block, rows: int, cols: int) -> torch.Tensor:
    """Block scales [..., ceil(rows / bn), ceil(cols / bk)] -> one per element [..., rows,
    cols]."""
    bn, bk = block
    per_row = scale.repeat_interleave(bn, dim=-2)[..., :rows, :]
    return per_row.repeat_interleave(bk, dim=-1)[..., :cols]


def dequantize(q: torch.Tensor, scales: BlockScales) -> torch.Tensor:
    """FP8 values [..., N, K] times their block scales, in float32."""
    rows, cols = q.shape[-2:]
    return q.float() * expand_blocks(scales.scale, scales.block, rows, cols)
