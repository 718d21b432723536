"""A checkpoint's FP8 weight times its scales, in every layout checkpoints ship
(`dequantize_checkpoint_weight`), against the element-wise product."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.layers.quantization.fp8_scales import (
    dequantize_checkpoint_weight,
    quantize_blocks,
    quantize_rows,
)

ROWS, COLS = 300, 200  # blocks of 128 rows: 128, 128, 44; groups of 128 columns: 128, 72


def weight() -> torch.Tensor:
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(0))


def per_element(scale: torch.Tensor, block_rows: int) -> torch.Tensor:
    """Each element's scale, block by block, by index arithmetic alone."""
    r = torch.arange(ROWS)[:, None] // block_rows
    c = torch.arange(COLS)[None, :] // 128
    return scale[r, c]


@pytest.mark.parametrize("block_rows", [1, 128])
def test_block_scales_multiply_their_blocks(block_rows: int) -> None:
    q, scale = quantize_blocks(weight(), block_rows)
    assert scale.shape == (-(-ROWS // block_rows), 2)
    got = dequantize_checkpoint_weight(q, scale)
    assert torch.equal(got, q.float() * per_element(scale, block_rows))


@pytest.mark.parametrize("shape", [(ROWS,), (ROWS, 1)])
def test_channel_scales_multiply_their_rows(shape: tuple[int, ...]) -> None:
    q, scale = quantize_rows(weight())
    got = dequantize_checkpoint_weight(q, scale.reshape(shape))
    assert torch.equal(got, q.float() * scale[:, None])


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_one_scale_multiplies_the_tensor(shape: tuple[int, ...]) -> None:
    q, _ = quantize_rows(weight())
    got = dequantize_checkpoint_weight(q, torch.full(shape, 0.5))
    assert torch.equal(got, q.float() * 0.5)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((ROWS - 1,), "299 channel scales for 300 rows"),
        ((3, 3), r"scales \(3, 3\) fit no layout of a \[300, 200\] FP8 weight"),
        ((4, 2), r"block scales \(4, 2\) fit neither 300 rows nor blocks of 128 rows"),
    ],
)
def test_scales_that_fit_no_layout_are_refused(shape: tuple[int, ...], message: str) -> None:
    q, _ = quantize_rows(weight())
    with pytest.raises(ValueError, match=message):
        dequantize_checkpoint_weight(q, torch.ones(shape))
