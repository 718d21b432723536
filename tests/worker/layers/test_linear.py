"""Weight slicing of the tensor-parallel linear layers, ranks simulated in one process.

Each rank's layer is built with a fake (rank, size) and loaded from the full tensor; the
ranks' outputs, combined as the collectives would (concatenate / sum), must equal the
unsharded layer's output.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers.activation import SiluAndMul
from radixmesh.worker.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from radixmesh.worker.layers.parallel import TPGroup
from radixmesh.worker.layers.weights import ShardId, get_weight_loader

SIZES = [2, 3]


def load(param: nn.Parameter | None, full: torch.Tensor, shard_id: ShardId = None) -> None:
    assert param is not None
    get_weight_loader(param)(param, full, shard_id)


@pytest.mark.parametrize("size", SIZES)
def test_column_parallel_takes_its_rows(size: int) -> None:
    w, b, x = torch.randn(12, 5), torch.randn(12), torch.randn(4, 5)
    outs = []
    for rank in range(size):
        layer = ColumnParallelLinear(5, 12, bias=True, tp=TPGroup(rank, size))
        load(layer.weight, w)
        assert layer.bias is not None
        load(layer.bias, b)
        rows = slice(rank * 12 // size, (rank + 1) * 12 // size)
        assert torch.equal(layer.weight, w[rows]) and torch.equal(layer.bias, b[rows])
        outs.append(layer(x))
    torch.testing.assert_close(torch.cat(outs, -1), F.linear(x, w, b))


@pytest.mark.parametrize("size", SIZES)
def test_merged_gate_up_keeps_pairs_on_one_rank(size: int) -> None:
    gate, up, x = torch.randn(6, 5), torch.randn(6, 5), torch.randn(4, 5)
    outs = []
    for rank in range(size):
        layer = MergedColumnParallelLinear(5, [6, 6], tp=TPGroup(rank, size))
        load(layer.weight, gate, 0)
        load(layer.weight, up, 1)
        rows = slice(rank * 6 // size, (rank + 1) * 6 // size)
        assert torch.equal(layer.weight, torch.cat([gate[rows], up[rows]]))
        outs.append(SiluAndMul()(layer(x)))  # each rank's gate/up halves match up
    torch.testing.assert_close(torch.cat(outs, -1), F.silu(x @ gate.T) * (x @ up.T))


def kv_head_of(q_head: int, num_heads: int, num_kv_heads: int) -> int:
    return q_head // (num_heads // num_kv_heads)  # the Hugging Face GQA convention


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "size"),
    [(6, 3, 3), (6, 2, 2), (6, 6, 3), (4, 1, 2), (8, 2, 4), (6, 3, 1)],
    ids=["kv-split-3", "kv-split-2", "mha-3", "kv-replicated-2", "kv-replicated-4", "tp1"],
)
def test_qkv_ranks_hold_the_kv_heads_of_their_query_heads(
    num_heads: int, num_kv_heads: int, size: int
) -> None:
    d, hidden = 4, 8
    q = torch.randn(num_heads * d, hidden)
    k, v = torch.randn(2, num_kv_heads * d, hidden)
    bq, bk = torch.randn(num_heads * d), torch.randn(num_kv_heads * d)
    for rank in range(size):
        layer = QKVParallelLinear(
            hidden, d, num_heads, num_kv_heads, bias=True, tp=TPGroup(rank, size)
        )
        assert layer.bias is not None
        for shard, full in (("q", q), ("k", k), ("v", v)):
            load(layer.weight, full, shard)
        for shard, full in (("q", bq), ("k", bk), ("v", bk)):
            load(layer.bias, full, shard)
        heads = range(rank * layer.num_heads, (rank + 1) * layer.num_heads)
        kv_heads = sorted({kv_head_of(h, num_heads, num_kv_heads) for h in heads})
        assert len(kv_heads) == layer.num_kv_heads
        q_local, k_local, v_local = layer.weight.split([layer.q_size, layer.kv_size, layer.kv_size])
        assert torch.equal(q_local, q.view(num_heads, d, hidden)[list(heads)].flatten(0, 1))
        assert torch.equal(k_local, k.view(num_kv_heads, d, hidden)[kv_heads].flatten(0, 1))
        assert torch.equal(v_local, v.view(num_kv_heads, d, hidden)[kv_heads].flatten(0, 1))
        assert torch.equal(
            layer.bias[layer.q_size :][: layer.kv_size],
            bk.view(num_kv_heads, d)[kv_heads].flatten(),
        )


@pytest.mark.parametrize("size", SIZES)
def test_row_parallel_partial_sums_add_up(size: int) -> None:
    w, x = torch.randn(5, 12), torch.randn(4, 12)
    partials = []
    for rank in range(size):
        layer = RowParallelLinear(12, 5, tp=TPGroup(rank, size))
        load(layer.weight, w)
        cols = slice(rank * 12 // size, (rank + 1) * 12 // size)
        assert torch.equal(layer.weight, w[:, cols])
        partials.append(F.linear(x[:, cols], layer.weight))  # what each rank all-reduces
    torch.testing.assert_close(sum(partials), x @ w.T)


def test_row_parallel_single_rank_adds_bias() -> None:
    w, b, x = torch.randn(5, 12), torch.randn(5), torch.randn(4, 12)
    layer = RowParallelLinear(12, 5, bias=True)
    load(layer.weight, w)
    load(layer.bias, b)
    torch.testing.assert_close(layer(x), F.linear(x, w, b))


def test_indivisible_sizes_name_the_field() -> None:
    with pytest.raises(ValueError, match="out_features: 10 is not divisible by the TP size 3"):
        ColumnParallelLinear(4, 10, tp=TPGroup(0, 3))
    with pytest.raises(ValueError, match="in_features"):
        RowParallelLinear(10, 4, tp=TPGroup(1, 3))
    with pytest.raises(ValueError, match="num_attention_heads"):
        QKVParallelLinear(8, 4, 5, 5, tp=TPGroup(0, 2))
    with pytest.raises(ValueError, match="num_key_value_heads"):
        QKVParallelLinear(8, 4, 6, 2, tp=TPGroup(0, 3))
    with pytest.raises(ValueError, match="num_key_value_heads"):
        QKVParallelLinear(8, 4, 12, 3, tp=TPGroup(0, 4))  # 3 heads over 4 ranks


def test_bad_loads_are_rejected() -> None:
    layer = QKVParallelLinear(8, 4, 2, 1)
    with pytest.raises(ValueError, match="shape mismatch"):
        load(layer.weight, torch.randn(9, 8), "q")
    with pytest.raises(ValueError, match="shape mismatch"):
        load(layer.weight, torch.randn(8, 7), "q")
    with pytest.raises(ValueError, match="unknown shard 'x'"):
        load(layer.weight, torch.randn(8, 8), "x")
    with pytest.raises(ValueError, match="shape mismatch"):
        load(RowParallelLinear(4, 3).weight, torch.randn(4, 3))


def test_tp_group_validates() -> None:
    with pytest.raises(ValueError, match="rank"):
        TPGroup(2, 2)
    with pytest.raises(ValueError, match="size"):
        TPGroup(0, 0)
