"""The interface of a weight quantization method for the linear layers.

A method takes over a layer's weight before the checkpoint loads: `create_weights`
replaces `layer.weight` (and may add scale parameters, each with a weight loader), so
the checkpoint's tensors land in the quantized form, slice by slice, and no
full-precision copy of the model is ever held. `apply` is the layer's matmul afterwards.

The layer keeps its own sharding: a method's loaders call `layer.weight_loader` with
tensors already in stored form, and it narrows them to this rank's rows or columns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch
from torch import nn

from radixmesh.worker.layers.quantization.fp8_activation import Fp8Activation
from radixmesh.worker.layers.weights import Loaded, ShardId


class QuantizableLinear(Protocol):
    """What a method uses of a linear layer (layers/dense.py's PackableLinear)."""

    weight: nn.Parameter
    weight_scale: nn.Parameter
    linear_method: LinearMethod | None

    def weight_loader(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
        """Copy this rank's part of the full checkpoint tensor `loaded` into `param`."""

    def output_rows(self, shard_id: ShardId) -> int:
        """Rows (output features) of the full checkpoint tensor that `shard_id` names."""

    def input_columns(self) -> int:
        """Columns (input features) of the full checkpoint tensor, all ranks together."""


class LinearMethod(ABC):
    name: str

    @abstractmethod
    def create_weights(self, layer: QuantizableLinear) -> None:
        """Replace `layer.weight` [out, in] by the quantized parameters (not yet loaded)."""

    @abstractmethod
    def check_loaded(self, layer: QuantizableLinear) -> None:
        """Raise ValueError if the checkpoint left part of the quantized state unfilled."""

    @abstractmethod
    def apply(
        self,
        layer: QuantizableLinear,
        x: torch.Tensor | Fp8Activation,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """x [T, in] -> [T, out] in x's dtype. An `Fp8Activation` comes only where
        `wants_fp8_input` said yes."""

    def wants_fp8_input(self, layer: QuantizableLinear, x: torch.Tensor) -> bool:
        """Whether `apply` would quantize an input with the rows, dtype and device of x per
        token for an FP8 GEMM, so that the op producing it may hand over an
        `Fp8Activation` instead (fp8.py). No, unless the method says so."""
        return False

    @abstractmethod
    def dequantized_weight(self, layer: QuantizableLinear, dtype: torch.dtype) -> torch.Tensor:
        """The weight [out, in] as the method's matmul sees it, in `dtype`."""
