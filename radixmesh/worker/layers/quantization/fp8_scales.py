"""How FP8 weight scales are laid out: per output channel, or per 128-column group.

Layouts (`SCALE_LAYOUTS`), each a way to cut W [out, in] into blocks sharing one float32
scale s = max|block| / 448 (e4m3's largest finite value, so each block uses the format's
whole range):
  channel   one scale per row: s[o]                              scale [out]
  1x128     one per row and 128 input columns: s[o, g]           scale [out, ceil(in/128)]
  128x128   one per 128 x 128 block, as DeepSeek-V3 / Qwen FP8 checkpoints ship them
            (`weight_scale_inv` [ceil(out/128), ceil(in/128)], `weight_block_size`
            [128, 128]); held expanded to rows, like 1x128

Both group layouts are held the same way in a layer, one scale per row and group
([out, ceil(in/128)]): a 128 x 128 block's scale is repeated on its 128 rows. That costs
4 bytes per 128 weight bytes (3% more to read) and buys one code path for both: every
kernel indexes scales by (row, k // 128), and tensor parallelism shards scales exactly
as it shards rows, also where fused q/k/v or gate/up pieces do not start on a multiple
of 128 rows. Only quantizing (at load, from full precision) differs between them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
# A zero block gets this scale instead of 0 (its values quantize to 0 either way).
MIN_SCALE = 1e-12
# Input columns a group scale covers: the only group width FP8 checkpoints use.
GROUP_K = 128
SCALE_LAYOUTS = ("channel", "1x128", "128x128")
# Rows of a block sharing one scale, per group layout.
BLOCK_ROWS = {"1x128": 1, "128x128": 128}


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    # A tensor divisor: CUDA divides by a Python scalar as a multiplication by its
    # reciprocal (1 ulp off now and then); IEEE division matches the Triton kernels.
    return (amax / torch.full_like(amax, FP8_MAX)).clamp_min(MIN_SCALE)


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [rows, cols] -> (FP8 [rows, cols], float32 scales [rows]): w ~= q * scale[:, None]."""
    w32 = w.float()
    scale = _scale_of(w32.abs().amax(dim=-1))
    q = (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def quantize_blocks(w: torch.Tensor, block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [rows, cols] -> (FP8 [rows, cols], float32 scales [ceil(rows/block_rows),
    ceil(cols/128)]): one scale per block of block_rows x 128, the checkpoint form
    (`weight_scale_inv`); blocks at the edges are partial."""
    rows, cols = w.shape
    groups, row_blocks = math.ceil(cols / GROUP_K), math.ceil(rows / block_rows)
    w32 = w.float()
    padded = F.pad(w32.abs(), (0, groups * GROUP_K - cols, 0, row_blocks * block_rows - rows))
    amax = padded.reshape(row_blocks, block_rows, groups, GROUP_K).amax(dim=(1, 3))
    scale = _scale_of(amax)  # [row_blocks, groups]
    q = (w32 / expand_scale(rows_of_blocks(scale, rows, block_rows), cols)).clamp(-FP8_MAX, FP8_MAX)
    return q.to(FP8), scale


def quantize(w: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """w [rows, cols] -> (FP8, scales as a layer holds them: [rows] or [rows, groups])."""
    if layout == "channel":
        return quantize_rows(w)
    q, scale = quantize_blocks(w, BLOCK_ROWS[layout])
    return q, rows_of_blocks(scale, w.shape[0], BLOCK_ROWS[layout])


def rows_of_blocks(scale: torch.Tensor, rows: int, block_rows: int = 128) -> torch.Tensor:
    """Block scales [ceil(rows/block_rows), groups] -> one row per weight row [rows,
    groups]: each block's scale repeated on its rows. Scales that already have a row per
    weight row are returned as they are; any other row count is a ValueError."""
    if scale.shape[0] == rows:
        return scale
    if scale.shape[0] != math.ceil(rows / block_rows):
        raise ValueError(
            f"block scales {tuple(scale.shape)} fit neither {rows} rows nor blocks of "
            f"{block_rows} rows"
        )
    return scale.repeat_interleave(block_rows, dim=0)[:rows]


def expand_scale(scale: torch.Tensor, cols: int) -> torch.Tensor:
    """Row-group scales [rows, groups] -> one per weight element [rows, cols]."""
    return scale.repeat_interleave(GROUP_K, dim=1)[:, :cols]


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q [rows, cols] times its scales, per row ([rows]) or per row and group
    ([rows, groups]), in float32, then rounded once to `dtype`."""
    if scale.dim() == 1:
        return (q.float() * scale[:, None]).to(dtype)
    return (q.float() * expand_scale(scale, q.shape[1])).to(dtype)


def checkpoint_scales(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A checkpoint's `weight_scale` (or `weight_scale_inv`) for a weight [rows, cols], in
    float32 on its device, as one scale per row ([rows]: a per-tensor scale ([] or [1])
    repeated, or per output channel ([rows] or [rows, 1])) or per row and 128-column group
    ([rows, groups]: blocks of 1 or 128 rows, [ceil(rows/b), groups], each block's scale
    on its rows). Any other shape is a ValueError."""
    scale = scale.to(torch.float32)
    if scale.numel() == 1:
        return scale.reshape(1).expand(rows)
    if scale.dim() == 1 or (scale.dim() == 2 and scale.shape == (rows, 1)):
        if scale.numel() != rows:
            raise ValueError(f"{scale.numel()} channel scales for {rows} rows")
        return scale.reshape(-1)
    groups = math.ceil(cols / GROUP_K)
    if scale.dim() != 2 or scale.shape[1] != groups:
        raise ValueError(
            f"scales {tuple(scale.shape)} fit no layout of a [{rows}, {cols}] FP8 weight"
        )
    return rows_of_blocks(scale, rows, 1 if scale.shape[0] == rows else 128)


def dequantize_checkpoint_weight(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """A checkpoint's FP8 weight [rows, cols] times its scales (any layout
    `checkpoint_scales` reads), in float32."""
    rows, cols = q.shape
    return dequantize_rows(q, checkpoint_scales(scale.to(q.device), rows, cols), torch.float32)
