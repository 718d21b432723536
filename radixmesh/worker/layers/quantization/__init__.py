"""Weight quantization methods by name (`ModelConfig.quantization`), imported when chosen.

`quantize_linears(model, name)` hands every linear layer of the decoder (q/k/v/o,
gate/up/down; not the embeddings or the LM head) to the method before the weights load;
`quantize_experts(model, name)` holds a mixture of experts' weights in FP8 too
(layers/quantization/fp8_experts.py), under every method here (all are FP8).
`dequantize_linears` turns both back into plain weights of the compute dtype holding the
quantized values: the CPU path, where no FP8 GEMM exists and converting every weight at
every step would cost more than the step itself (see fp8.py).
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from radixmesh.worker.layers.dense import PackableLinear
from radixmesh.worker.layers.quantization.base import LinearMethod

# name -> "module:factory", the factory called with the name. The fp8 names differ only in
# how full-precision weights are quantized at load (fp8.py; "fp8" is the measured default).
# "fp8-static" is what an FP8 checkpoint with static activation scales loads as (fp8_static.py).
_FP8 = "radixmesh.worker.layers.quantization.fp8:method_for"
_METHODS: dict[str, str] = {
    "fp8": _FP8,
    "fp8-channel": _FP8,
    "fp8-1x128": _FP8,
    "fp8-128x128": _FP8,
    "fp8-static": "radixmesh.worker.layers.quantization.fp8_static:method_for",
}


def quantization_methods() -> list[str]:
    return sorted(_METHODS)


def linear_method(name: str) -> LinearMethod:
    if name not in _METHODS:
        raise ValueError(f"quantization: unknown {name!r}; choices: {quantization_methods()}")
    module_name, factory = _METHODS[name].split(":")
    method: LinearMethod = getattr(importlib.import_module(module_name), factory)(name)
    return method


def quantizable_layers(model: nn.Module) -> list[PackableLinear]:
    """The decoder's linear layers: every PackableLinear except the LM head."""
    from radixmesh.worker.layers.embedding import ParallelLMHead

    return [
        m
        for m in model.modules()
        if isinstance(m, PackableLinear) and not isinstance(m, ParallelLMHead)
    ]


def quantize_linears(model: nn.Module, name: str) -> int:
    """Give every decoder linear layer of a model not yet loaded to method `name`."""
    method = linear_method(name)
    layers = quantizable_layers(model)
    for layer in layers:
        method.create_weights(layer)
    return len(layers)


def quantize_experts(model: nn.Module, name: str) -> int:
    """Hold the experts of every sparse layer of a model not yet loaded in FP8, their
    scales in the blocks method `name` gives a checkpoint (fp8_experts.checkpoint_block)."""
    from radixmesh.worker.layers.moe import SparseMoE
    from radixmesh.worker.layers.quantization.fp8_experts import checkpoint_block

    linear_method(name)  # an unknown name is refused here too
    layers = [m for m in model.modules() if isinstance(m, SparseMoE)]
    for layer in layers:
        layer.use_fp8(checkpoint_block(name))
    return len(layers)


def dequantize_linears(model: nn.Module, dtype: torch.dtype) -> int:
    """Replace each quantized layer's weights (FP8 experts' too) by its dequantized weight
    in `dtype`."""
    from radixmesh.worker.layers.moe import SparseMoE

    count = 0
    for moe in model.modules():
        if isinstance(moe, SparseMoE) and moe.fp8:
            moe.dequantize_(dtype)
            count += 1
    for layer in quantizable_layers(model):
        method = layer.linear_method
        if method is not None:
            weight = method.dequantized_weight(layer, dtype)
            layer.linear_method = None
            # A static input scale goes too: dequantized layers run unquantized activations.
            for name in [n for n, _ in layer.named_parameters(recurse=False)]:
                if name.startswith("weight_") or name == "input_scale":
                    delattr(layer, name)
            layer.weight = nn.Parameter(weight, requires_grad=False)
            count += 1
    return count
