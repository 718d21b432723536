"""The FP8 experts' scale layouts (layers/quantization/fp8_experts.py): which blocks a rank
holds, a checkpoint's scales mapped onto them element for element (or refused), and
dequantization against index arithmetic."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.layers.quantization.fp8_experts import (
    BlockScales,
    block_scales,
    checkpoint_block,
    dequantize,
    element_scales,
    held_blocks,
)
from radixmesh.worker.layers.quantization.fp8_scales import checkpoint_scales


@pytest.mark.parametrize(
    ("method", "block"),
    [("fp8", None), ("fp8-channel", None), ("fp8-static", None),
     ("fp8-128x128", (128, 128)), ("fp8-1x128", (1, 128))],
)  # fmt: skip
def test_the_method_names_the_checkpoint_blocks(method: str, block: tuple[int, int]) -> None:
    assert checkpoint_block(method) == block


@pytest.mark.parametrize(
    ("checkpoint", "local_size", "tp_size", "w13", "w2"),
    [
        (None, 768, 1, (1, 2048), (1, 768)),  # per row, whatever the sizes
        ((128, 128), 768, 1, (128, 128), (128, 128)),  # Qwen3-30B-A3B-FP8 on one GPU
        ((128, 128), 384, 2, (128, 128), (128, 128)),  # ... on 2: whole blocks
        ((128, 128), 96, 8, (1, 128), (128, 32)),  # ... on 8: up starts mid-block
        ((128, 128), 160, 1, (1, 128), (128, 128)),  # one rank: w2 is not split
        ((128, 128), 40, 2, (1, 128), (1, 40)),  # gcd(40, 128) = 8: w2 per row
        ((1, 128), 96, 8, (1, 128), (1, 32)),
    ],
)
def test_held_blocks_keep_every_rank_on_whole_blocks(
    checkpoint: tuple[int, int] | None,
    local_size: int,
    tp_size: int,
    w13: tuple[int, int],
    w2: tuple[int, int],
) -> None:
    assert held_blocks(checkpoint, 2048, local_size, tp_size) == (w13, w2)


def checkpoint_grid(rows: int, cols: int, block_rows: int) -> torch.Tensor:
    """Distinct block scales of a [rows, cols] weight, as checkpoint_scales gives them."""
    blocks = torch.arange(1.0, 1 + -(-rows // block_rows) * -(-cols // 128))
    stored = blocks.reshape(-(-rows // block_rows), -1)
    return checkpoint_scales(stored, rows, cols)


def test_block_scales_of_a_ranks_columns_take_the_checkpoints_scales() -> None:
    """w2 of Qwen3-30B-A3B at 8 ranks, rank 1: columns 96..192 of a [300, 768] weight,
    held in 128 x 32 blocks; every element's scale is its checkpoint block's."""
    scale = checkpoint_grid(300, 768, 128)  # [300, 6]
    blocks = block_scales(scale, (0, 300), (96, 96), 768, (128, 32))
    assert blocks is not None and tuple(blocks.shape) == (3, 3)
    held = BlockScales(blocks, (128, 32))
    per_element = dequantize(torch.ones(300, 96, dtype=torch.float8_e4m3fn), held)
    assert torch.equal(per_element, element_scales(scale, (0, 300), (96, 96), 768))
    r = torch.arange(300)[:, None] // 128
    c = (96 + torch.arange(96))[None, :] // 128
    assert torch.equal(per_element, 1 + r * 6 + c)  # the stored block's scale, by index


def test_blocks_that_would_span_two_scales_are_refused() -> None:
    scale = checkpoint_grid(300, 768, 128)
    # columns 96..192 in blocks of 128: the first would hold groups 0 and 1
    assert block_scales(scale, (0, 300), (96, 96), 768, (128, 128)) is None
    # rows 96..192 of a gate in 128-row blocks: rows of two checkpoint blocks
    assert block_scales(scale, (96, 96), (0, 768), 768, (128, 128)) is None
    assert block_scales(scale, (96, 96), (0, 768), 768, (1, 128)) is not None
    # per row over all columns: the groups' scales differ
    assert block_scales(scale, (0, 300), (0, 768), 768, (1, 768)) is None


def test_channel_and_tensor_scales_fit_any_row_block_that_they_fill() -> None:
    channel = checkpoint_scales(torch.arange(1.0, 301.0), 300, 200)  # [300]
    blocks = block_scales(channel, (100, 50), (40, 60), 200, (1, 60))
    assert blocks is not None and torch.equal(blocks, torch.arange(101.0, 151.0)[:, None])
    assert block_scales(channel, (0, 256), (0, 200), 200, (128, 128)) is None
    tensor = checkpoint_scales(torch.tensor(0.5), 300, 200)
    blocks = block_scales(tensor, (0, 256), (0, 200), 200, (128, 128))
    assert blocks is not None and torch.equal(blocks, torch.full((2, 2), 0.5))


def test_dequantize_multiplies_each_element_by_its_blocks_scale() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 300, 200, generator=gen).to(torch.float8_e4m3fn)
    scale = torch.rand(3, 3, 7, generator=gen)  # blocks of 128 x 32: partial at both edges
    got = dequantize(q, BlockScales(scale, (128, 32)))
    r = torch.arange(300)[:, None] // 128
    c = torch.arange(200)[None, :] // 32
    assert torch.equal(got, q.float() * scale[:, r, c])
