"""Static activation scales: FP8 checkpoints calibrated offline (quantization_config
`activation_scheme: "static"`) ship one float32 `input_scale` per linear layer, used in
place of the per-token scales fp8.py computes at run time.

x ~= X * s with X = e4m3(clamp(x / s, -448, 448)), s the layer's scalar: no amax pass over
the rows, and a value beyond 448 s saturates (the calibration chose s so few do). A fused
weight (q/k/v, gate/up) reads one input, so it gets the largest of its pieces' scales:
one scale must cover the range each piece was calibrated for, and a smaller one would
clip inputs another piece expects to see (other engines combine them the same way). Each
tensor-parallel rank holds the same whole scalar.

Matmul on CUDA, where fp8.py's `_scaled_mm` applies (sm90+, bfloat16, dims multiples of
16): a layer whose weight scale is one value (o, down; fused pieces of equal scales) runs
the tensor-wise `_scaled_mm`, both scales scalar, straight to the output dtype; per-channel
weight scales (fused pieces with different per-tensor scales) the row-wise `_scaled_mm`,
the scalar repeated on every row. Elsewhere (CPU, other dtypes): x quantized and
dequantized with the same scale, then fp8.py's dequantize-then-matmul, so the CPU
multiplies the operands the GPU does. The small-batch weight-only kernels and the fused
activation quantization do not apply: both feed the GEMM other numbers than x quantized
with s. A layer the checkpoint stored in full precision (quantized at load) has no input
scale and keeps per-token quantization, all of fp8.py's paths included.
"""

from __future__ import annotations

import math
from typing import Protocol, cast

import torch
from torch import nn

from radixmesh.worker.layers.quantization.base import LinearMethod, QuantizableLinear
from radixmesh.worker.layers.quantization.fp8 import (
    Fp8LinearMethod,
    fp8_activation_scaled_mm,
    fp8_linear_ref,
    scaled_mm_applies,
)
from radixmesh.worker.layers.quantization.fp8_activation import Fp8Activation
from radixmesh.worker.layers.quantization.fp8_scales import FP8, FP8_MAX
from radixmesh.worker.layers.weights import (
    Loaded,
    ShardId,
    as_tensor,
    mark_optional,
    set_weight_loader,
)

NAME = "fp8-static"


def check_input_scale(loaded: torch.Tensor) -> torch.Tensor:
    """A checkpoint's input_scale as float32 []: one finite value above 0, else a
    ValueError saying what it holds."""
    if loaded.numel() != 1:
        raise ValueError(f"input_scale must be one value, got shape {tuple(loaded.shape)}")
    scale = loaded.detach().reshape(()).to(torch.float32)
    value = float(scale)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"input_scale must be finite and above 0, got {value}")
    return scale


def quantize_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [T, in] -> e4m3 [T, in]: clamp(x / scale, -448, 448), divided in float32 (IEEE
    division on every device, so the CPU rounds as the GPU does). One kernel on CUDA
    (layers/kernels/fp8_quant.py's `static_fp8`, the same bits), else PyTorch."""
    from radixmesh.worker.layers import kernels

    if kernels.enabled(x) and x.stride(-1) == 1:
        from radixmesh.worker.layers.kernels.fp8_quant import static_fp8

        return static_fp8(x, scale)
    return quantize_static_ref(x, scale)


def quantize_static_ref(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`quantize_static` in PyTorch (float32 temporaries of x's size)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def static_linear_ref(
    x: torch.Tensor,
    scale: torch.Tensor,
    q: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The reference and the CPU path: x quantized with `scale` [] and dequantized in x's
    dtype, then fp8.py's dequantize-then-matmul with q [out, in] and weight_scale [out]."""
    x_deq = (quantize_static_ref(x, scale).float() * scale).to(x.dtype)  # [T, in]
    return fp8_linear_ref(x_deq, q, weight_scale, bias)


def static_scaled_mm(
    x: torch.Tensor,
    scale: torch.Tensor,
    q: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    tensorwise: bool,
) -> torch.Tensor:
    """x [T, in] quantized with `scale` [], times q [out, in] through `_scaled_mm`, in x's
    dtype. tensorwise: weight_scale [out] holds one value (its first is the GEMM's
    scale); else row-wise scaling, `scale` on every row."""
    xq = quantize_static(x, scale)  # [T, in] e4m3
    if not tensorwise:
        rows = scale.expand(xq.shape[0]).contiguous()  # [T]: row-wise wants one per row
        return fp8_activation_scaled_mm(Fp8Activation(xq, rows, x.dtype), q, weight_scale, bias)
    y = torch._scaled_mm(
        xq,
        q.t(),  # [in, out], column-major: the layout the FP8 GEMM wants
        scale_a=scale,
        scale_b=weight_scale[0],
        out_dtype=x.dtype,
    )
    return y if bias is None else y + bias


def fp8_static_linear(
    x: torch.Tensor,
    scale: torch.Tensor,
    q: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    tensorwise: bool,
) -> torch.Tensor:
    """x [T, in] @ (q [out, in] * weight_scale [out])^T + bias -> [T, out] in x's dtype,
    x quantized with the static `scale` []: `_scaled_mm` where it applies, else the
    reference."""
    if x.shape[0] > 0 and scaled_mm_applies(x, q):
        return static_scaled_mm(x, scale, q, weight_scale, bias, tensorwise=tensorwise)
    return static_linear_ref(x, scale, q, weight_scale, bias)


class StaticScaledLinear(QuantizableLinear, Protocol):
    """What this method adds to a layer."""

    input_scale: nn.Parameter | None  # float32 []; None: per-token quantization
    weight_scale_is_scalar: bool  # every row's weight scale equal: tensor-wise GEMM


def _static(layer: QuantizableLinear) -> StaticScaledLinear:
    return cast(StaticScaledLinear, layer)


def _load_input_scale(param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
    """One checkpoint input_scale into the layer's: the largest of those given (the
    layer's fused pieces each bring one). NaN until the first comes (fmax skips it)."""
    scale = check_input_scale(as_tensor(loaded)).to(param.device)
    param.data.copy_(torch.fmax(param.data, scale))


class Fp8StaticLinearMethod(LinearMethod):
    """FP8 weights as the checkpoint stores them, per tensor or per channel (fp8.py's
    channel layout, whose loaders, checks and dequantization this method reuses), with the
    checkpoint's static input scale as the layer's `input_scale` parameter."""

    name = NAME

    def __init__(self) -> None:
        self.weights = Fp8LinearMethod("channel")

    def create_weights(self, layer: QuantizableLinear) -> None:
        self.weights.create_weights(layer)
        layer.linear_method = self
        static = _static(layer)
        static.input_scale = nn.Parameter(
            torch.full((), float("nan"), dtype=torch.float32, device=layer.weight.device),
            requires_grad=False,
        )
        set_weight_loader(static.input_scale, _load_input_scale)
        mark_optional(static.input_scale)  # absent for a layer stored in full precision
        static.weight_scale_is_scalar = False

    def check_loaded(self, layer: QuantizableLinear) -> None:
        """fp8.py's check, then the layer's path fixed for good: with its input scale, or
        per token where the checkpoint gave none (hf.py requires one for every FP8 weight
        of a checkpoint)."""
        self.weights.check_loaded(layer)
        static = _static(layer)
        if static.input_scale is not None and torch.isnan(static.input_scale):
            static.input_scale = None
        scale = layer.weight_scale
        static.weight_scale_is_scalar = bool((scale == scale[0]).all())

    def apply(
        self,
        layer: QuantizableLinear,
        x: torch.Tensor | Fp8Activation,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        static = _static(layer)
        if static.input_scale is None:
            return self.weights.apply(layer, x, bias)
        if isinstance(x, Fp8Activation):
            raise ValueError("a layer with a static input scale takes its input unquantized")
        return fp8_static_linear(
            x,
            static.input_scale,
            layer.weight,
            layer.weight_scale,
            bias,
            tensorwise=static.weight_scale_is_scalar,
        )

    def wants_fp8_input(self, layer: QuantizableLinear, x: torch.Tensor) -> bool:
        # The fused producers quantize per token: a static scale goes around them.
        return _static(layer).input_scale is None and self.weights.wants_fp8_input(layer, x)

    def dequantized_weight(self, layer: QuantizableLinear, dtype: torch.dtype) -> torch.Tensor:
        return self.weights.dequantized_weight(layer, dtype)


def method_for(name: str) -> Fp8StaticLinearMethod:
    """ "fp8-static": what hf.py names an FP8 checkpoint with static activation scales."""
    return Fp8StaticLinearMethod()
