"""FP8 weights with scales per row and 128 input columns (quantized per 1 x 128 or
128 x 128 block): the quantization, checkpoint scales of every granularity landing in the
layer's [out, groups] form, sharding under tensor parallelism, and the CPU paths."""

from __future__ import annotations

from typing import TypeVar

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers.dense import PackableLinear
from radixmesh.worker.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from radixmesh.worker.layers.parallel import TPGroup
from radixmesh.worker.layers.quantization import dequantize_linears, linear_method
from radixmesh.worker.layers.quantization.fp8 import fp8_linear, fp8_linear_ref
from radixmesh.worker.layers.quantization.fp8_scales import (
    FP8,
    FP8_MAX,
    dequantize_rows,
    expand_scale,
    quantize,
    quantize_blocks,
    quantize_rows,
    rows_of_blocks,
)
from radixmesh.worker.layers.weights import ShardId, get_weight_loader

L = TypeVar("L", bound=PackableLinear)


def gaussian(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def fp8_layer(layer: L, name: str) -> L:
    linear_method(name).create_weights(layer)
    return layer


def load(param: nn.Parameter, full: torch.Tensor, shard_id: ShardId = None) -> None:
    get_weight_loader(param)(param, full, shard_id)


def test_block_scales_are_each_blocks_amax_over_448() -> None:
    w = gaussian(300, 260, seed=0)  # partial blocks on both edges: 3 x 3 blocks of 128
    q, scale = quantize_blocks(w, 128)
    assert q.dtype == FP8 and scale.shape == (3, 3)
    assert float(scale[2, 2]) == float(w[256:, 256:].abs().amax() / FP8_MAX)
    assert float(scale[0, 1]) == float(w[:128, 128:256].abs().amax() / FP8_MAX)
    q1, scale1 = quantize_blocks(w, 1)
    assert scale1.shape == (300, 3)
    assert float(scale1[7, 2]) == float(w[7, 256:].abs().amax() / FP8_MAX)
    # Every element within half an e4m3 step of itself (or of the subnormal step).
    for q_, s_ in ((q, rows_of_blocks(scale, 300)), (q1, scale1)):
        back = dequantize_rows(q_, s_, torch.float32)
        bound = torch.maximum(w.abs() * 2.0**-4, expand_scale(s_, 260) * 2.0**-10)
        assert bool(((back - w).abs() <= bound * (1 + 1e-6)).all())


def test_rows_of_blocks_repeats_block_rows_and_rejects_other_counts() -> None:
    scale = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    rows = rows_of_blocks(scale, 130)
    assert rows.shape == (130, 2) and rows[127].tolist() == [1.0, 2.0]
    assert rows[128].tolist() == [3.0, 4.0]
    assert rows_of_blocks(scale, 2) is scale  # already one row per weight row
    with pytest.raises(ValueError, match="fit neither"):
        rows_of_blocks(scale, 300)


def test_groups_are_finer_than_channels_where_columns_differ() -> None:
    # e4m3 is a float format: a scale only matters to values it pushes below 2^-6 (the
    # subnormals, a fixed step of 2^-9), i.e. more than 448 / 2^-6 = 28672x under the
    # block's largest. One column 10^5 x the others in every row: a row scale sized for it
    # puts the row's other columns there; group scales only that column's group.
    w = gaussian(64, 512, seed=1)
    w[:, 3] *= 1e5
    errors = {}
    for layout in ("channel", "1x128", "128x128"):
        back = dequantize_rows(*quantize(w, layout), torch.float32)
        errors[layout] = float((back - w)[:, 128:].norm() / w[:, 128:].norm())
    assert max(errors["1x128"], errors["128x128"]) < errors["channel"] / 2, errors


@pytest.mark.parametrize("layout", ["1x128", "128x128"])
def test_column_shards_hold_exactly_the_single_rank_rows(layout: str) -> None:
    gate, up = gaussian(192, 300, seed=2), gaussian(192, 300, seed=3)
    one = fp8_layer(MergedColumnParallelLinear(300, [192, 192]), f"fp8-{layout}")
    load(one.weight, gate, 0)
    load(one.weight, up, 1)
    assert one.weight_scale.shape == (384, 3)
    for rank in range(2):
        mlp = fp8_layer(
            MergedColumnParallelLinear(300, [192, 192], tp=TPGroup(rank, 2)), f"fp8-{layout}"
        )
        load(mlp.weight, gate, 0)
        load(mlp.weight, up, 1)
        rows = torch.cat([torch.arange(rank * 96, (rank + 1) * 96) + o for o in (0, 192)])
        assert torch.equal(mlp.weight.view(torch.uint8), one.weight[rows].view(torch.uint8))
        assert torch.equal(mlp.weight_scale, one.weight_scale[rows])


def test_row_shards_hold_their_own_groups() -> None:
    down = gaussian(48, 512, seed=4)
    one = fp8_layer(RowParallelLinear(512, 48), "fp8-1x128")
    load(one.weight, down)
    assert one.weight_scale.shape == (48, 4)
    for rank in range(2):
        row = fp8_layer(RowParallelLinear(512, 48, tp=TPGroup(rank, 2)), "fp8-1x128")
        load(row.weight, down)
        cols = slice(rank * 256, (rank + 1) * 256)
        assert torch.equal(row.weight.view(torch.uint8), one.weight[:, cols].view(torch.uint8))
        assert torch.equal(row.weight_scale, one.weight_scale[:, rank * 2 : rank * 2 + 2])


def test_row_shards_that_would_split_a_group_are_refused() -> None:
    with pytest.raises(ValueError, match="96 input columns are not a multiple of 128"):
        fp8_layer(RowParallelLinear(192, 48, tp=TPGroup(0, 2)), "fp8-1x128")
    fp8_layer(RowParallelLinear(192, 48, tp=TPGroup(0, 2)), "fp8-channel")  # no groups
    fp8_layer(RowParallelLinear(192, 48), "fp8-1x128")  # one rank: a partial last group


def test_checkpoint_scales_of_every_granularity_land_as_row_groups() -> None:
    values = gaussian(200, 300, seed=5).to(FP8)
    cases = {
        "per tensor": (torch.tensor(0.5), torch.full((200, 3), 0.5)),
        "per channel": (torch.arange(200.0)[:, None], torch.arange(200.0)[:, None].expand(200, 3)),
        "128 x 128": (torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), None),
    }
    for name, (stored, want) in cases.items():
        layer = fp8_layer(RowParallelLinear(300, 200), "fp8-1x128")
        load(layer.weight, values)
        load(layer.weight_scale, stored)
        linear_method("fp8-1x128").check_loaded(layer)
        expected = want if want is not None else rows_of_blocks(stored, 200)
        assert torch.equal(layer.weight_scale, expected), name
    channel = fp8_layer(RowParallelLinear(300, 200), "fp8-channel")
    with pytest.raises(ValueError, match="block scales"):
        load(channel.weight_scale, cases["128 x 128"][0])


def test_group_layers_forward_and_dequantize_once_agree() -> None:
    x, w, b = gaussian(5, 300, seed=6), gaussian(40, 300, seed=7), gaussian(40, seed=8)
    layer = fp8_layer(RowParallelLinear(300, 40, bias=True), "fp8-1x128")
    load(layer.weight, w)
    load(layer.bias, b)  # type: ignore[arg-type]
    model = nn.Sequential(layer)
    q, scale = layer.weight.detach().clone(), layer.weight_scale.detach().clone()
    before = model(x)
    torch.testing.assert_close(before, fp8_linear(x, q, scale, b), rtol=0, atol=0)
    exact = F.linear(x, w, b)
    assert float((before - exact).norm() / exact.norm()) < 0.03
    assert dequantize_linears(model, torch.float32) == 1
    assert torch.equal(layer.weight, dequantize_rows(q, scale, torch.float32))
    torch.testing.assert_close(model(x), before)


def test_reference_with_group_scales_against_float32() -> None:
    x, w = gaussian(9, 384, seed=9), gaussian(64, 384, seed=10)
    q_rows, s_rows = quantize_rows(w)
    q, s = quantize(w, "1x128")
    ref = F.linear(x, w)
    err = float((fp8_linear_ref(x, q, s, None) - ref).norm() / ref.norm())
    err_rows = float((fp8_linear_ref(x, q_rows, s_rows, None) - ref).norm() / ref.norm())
    assert err < 0.03 and err <= err_rows * 1.05, (err, err_rows)
