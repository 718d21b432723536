"""Linear layers split across a tensor-parallel group (Megatron-style).

Column-parallel: the output features are split; each rank computes its slice and no
communication is needed, so the next op must consume a sharded input (attention heads,
the SiLU-and-mul). Row-parallel: the input features are split; each rank computes a
partial sum over its slice and an all-reduce adds them. A column -> row pair therefore
costs one all-reduce.

Fused variants (`MergedColumnParallelLinear` for gate/up, `QKVParallelLinear` for q/k/v)
hold several checkpoint tensors in one weight so that one matmul replaces several; their
loader places each checkpoint tensor's slice at its offset. On CPU this matters: a
decode step is dominated by per-op overhead and small matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixmesh.worker.layers.dense import PackableLinear
from radixmesh.worker.layers.parallel import SINGLE, TPGroup
from radixmesh.worker.layers.weights import (
    Loaded,
    ShardId,
    copy_checked,
    new_parameter,
    set_weight_loader,
)

if TYPE_CHECKING:
    from radixmesh.worker.layers.quantization.fp8_activation import Fp8Activation


@dataclass(frozen=True)
class _Piece:
    """One checkpoint tensor inside a fused column-parallel weight (rows along dim 0)."""

    full_size: int  # rows in the checkpoint tensor
    local_offset: int  # first row of this rank's slice inside the fused weight
    local_size: int  # rows this rank holds
    source_start: int  # first checkpoint row of this rank's slice


class _ColumnSharded(PackableLinear):
    """A weight made of pieces stacked along the output dim, each split across ranks."""

    def __init__(
        self,
        in_features: int,
        pieces: list[_Piece],
        *,
        bias: bool,
        tp: TPGroup,
        dtype: torch.dtype | None,
        device: torch.device | str | None,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.in_features = in_features
        self.pieces = pieces
        self.out_local = sum(p.local_size for p in pieces)
        self.weight = new_parameter(self.out_local, in_features, dtype=dtype, device=device)
        set_weight_loader(self.weight, self.weight_loader)
        self.bias: nn.Parameter | None = None
        if bias:
            self.bias = new_parameter(self.out_local, dtype=dtype, device=device)
            set_weight_loader(self.bias, self.weight_loader)

    def _piece_index(self, shard_id: ShardId) -> int:
        if shard_id is None and len(self.pieces) == 1:
            return 0
        if isinstance(shard_id, int) and 0 <= shard_id < len(self.pieces):
            return shard_id
        raise ValueError(f"unknown shard {shard_id!r} for a layer of {len(self.pieces)} parts")

    def output_rows(self, shard_id: ShardId) -> int:
        return self.pieces[self._piece_index(shard_id)].full_size

    def input_columns(self) -> int:
        return self.in_features

    def weight_loader(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
        """Copy this rank's rows of the full checkpoint tensor `loaded` (weight, bias or a
        per-row scale)."""
        piece = self.pieces[self._piece_index(shard_id)]
        if loaded.shape[0] != piece.full_size:
            raise ValueError(
                f"shape mismatch: expected {piece.full_size} rows, got {tuple(loaded.shape)}"
            )
        src = loaded.narrow(0, piece.source_start, piece.local_size)
        copy_checked(param.data.narrow(0, piece.local_offset, piece.local_size), src)

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        return self.matmul(x, self.bias)  # [T, out_local]


class ColumnParallelLinear(_ColumnSharded):
    """y = x W^T + b, W [out_features, in_features] split by rows: rank r holds its block."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = False,
        tp: TPGroup | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        tp = tp or SINGLE
        local = tp.divide(out_features, "out_features")
        piece = _Piece(out_features, 0, local, tp.rank * local)
        super().__init__(in_features, [piece], bias=bias, tp=tp, dtype=dtype, device=device)


class MergedColumnParallelLinear(_ColumnSharded):
    """Several column-parallel outputs of one input in one weight, e.g. gate_proj and up_proj.

    Output layout per rank: [piece 0 slice | piece 1 slice | ...]; shard_id is the index.
    """

    def __init__(
        self,
        in_features: int,
        output_sizes: list[int],
        *,
        bias: bool = False,
        tp: TPGroup | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        tp = tp or SINGLE
        pieces, offset = [], 0
        for i, size in enumerate(output_sizes):
            local = tp.divide(size, f"output_sizes[{i}]")
            pieces.append(_Piece(size, offset, local, tp.rank * local))
            offset += local
        super().__init__(in_features, pieces, bias=bias, tp=tp, dtype=dtype, device=device)


class QKVParallelLinear(_ColumnSharded):
    """q, k and v projections fused; shard ids "q", "k", "v". Output [q | k | v] per rank.

    Query heads are split evenly. KV heads are split when there are at least as many as
    ranks; otherwise each rank keeps one KV head, replicated over size // num_kv_heads
    ranks, so every rank's query heads find their KV head locally.
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        *,
        bias: bool = False,
        tp: TPGroup | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        tp = tp or SINGLE
        heads = tp.divide(num_heads, "num_attention_heads")
        if num_kv_heads >= tp.size:
            kv_heads = tp.divide(num_kv_heads, "num_key_value_heads")
            kv_head_start = tp.rank * kv_heads
        else:
            kv_heads = 1
            kv_head_start = tp.rank // _replicas(num_kv_heads, tp.size)
        q_size, kv_size = heads * head_dim, kv_heads * head_dim
        kv_start = kv_head_start * head_dim
        pieces = [
            _Piece(num_heads * head_dim, 0, q_size, tp.rank * q_size),
            _Piece(num_kv_heads * head_dim, q_size, kv_size, kv_start),
            _Piece(num_kv_heads * head_dim, q_size + kv_size, kv_size, kv_start),
        ]
        super().__init__(hidden_size, pieces, bias=bias, tp=tp, dtype=dtype, device=device)
        self.head_dim = head_dim
        self.num_heads = heads  # on this rank
        self.num_kv_heads = kv_heads  # on this rank
        self.q_size = q_size
        self.kv_size = kv_size

    def _piece_index(self, shard_id: ShardId) -> int:
        if shard_id in ("q", "k", "v"):
            return "qkv".index(str(shard_id))
        raise ValueError(f"unknown shard {shard_id!r}: expected 'q', 'k' or 'v'")


def _replicas(num_kv_heads: int, tp_size: int) -> int:
    if tp_size % num_kv_heads:
        raise ValueError(
            f"num_key_value_heads: {num_kv_heads} KV heads cannot be replicated evenly "
            f"over TP size {tp_size}"
        )
    return tp_size // num_kv_heads


class RowParallelLinear(PackableLinear):
    """y = x W^T + b, W [out_features, in_features] split by columns; partial sums all-reduced.

    The input is the rank's slice of the features (what a column-parallel layer produced).
    The bias is added once, after the reduction.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = False,
        tp: TPGroup | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp or SINGLE
        self.in_local = self.tp.divide(in_features, "in_features")
        self.out_features = out_features
        self.weight = new_parameter(out_features, self.in_local, dtype=dtype, device=device)
        set_weight_loader(self.weight, self.weight_loader)
        self.bias: nn.Parameter | None = None
        if bias:
            self.bias = new_parameter(out_features, dtype=dtype, device=device)
            set_weight_loader(self.bias, self.weight_loader)

    def output_rows(self, shard_id: ShardId) -> int:
        return self.out_features

    def input_columns(self) -> int:
        return self.in_local * self.tp.size

    def weight_loader(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
        if shard_id is not None:
            raise ValueError(f"unsharded parameter got shard {shard_id!r}")
        if param.dim() == 1:  # the bias, or a quantized weight's per-row scale: every rank
            copy_checked(param.data, loaded)  # holds all rows
            return
        # A quantized weight's scales per row and group of input columns [out, groups]:
        # this rank's groups (its columns are whole groups: the method checks).
        local = self.in_local if param is self.weight else param.shape[1]
        expected = (self.out_features, local * self.tp.size)
        if tuple(loaded.shape) != expected:
            raise ValueError(f"shape mismatch: expected {expected}, got {tuple(loaded.shape)}")
        copy_checked(param.data, loaded.narrow(1, self.tp.rank * local, local))

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        if self.tp.size == 1:
            return self.matmul(x, self.bias)  # [T, out_features]
        # [T, out_features], partial sums over this rank's input slice, then summed
        y = self.tp.all_reduce(self.matmul(x, None))
        return y if self.bias is None else y + self.bias
