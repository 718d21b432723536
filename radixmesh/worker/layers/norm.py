"""RMSNorm (Llama): x / sqrt(mean(x^2) + eps) * weight, statistics in float32.

With a residual, the norm first adds its input into the residual stream (vLLM-style
pre-norm): residual <- x + residual, in place, then normalizes the sum. On CUDA both run
as one Triton kernel (`layers/kernels/rms_norm.py`); elsewhere, and where
`kernels.enabled` is off, as PyTorch ops, which are also the kernel's reference.

`quantize=True` (the caller's next layer is an FP8 linear on the `_scaled_mm` path, which
the caller asked it: `PackableLinear.wants_fp8_input`) returns the normed rows quantized
per token, an `Fp8Activation`: on CUDA the same kernel writes e4m3 rows and their scales
(bit for bit the quantization of its 16-bit output), elsewhere the 16-bit output is
quantized after.
"""

from __future__ import annotations

from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers import kernels
from radixmesh.worker.layers.quantization.fp8_activation import Fp8Activation
from radixmesh.worker.layers.weights import new_parameter


class RMSNorm(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_parameter(hidden_size, dtype=dtype, device=device)
        self.fusable = hidden_size <= kernels.MAX_NORM_HIDDEN

    @overload
    def forward(
        self, x: torch.Tensor, residual: None = None, *, quantize: Literal[False] = False
    ) -> torch.Tensor: ...
    @overload
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor, *, quantize: Literal[False] = False
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def forward(
        self, x: torch.Tensor, residual: None = None, *, quantize: bool
    ) -> torch.Tensor | Fp8Activation: ...
    @overload
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor, *, quantize: bool
    ) -> tuple[torch.Tensor | Fp8Activation, torch.Tensor]: ...
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, *, quantize: bool = False
    ) -> (
        torch.Tensor
        | Fp8Activation
        | tuple[torch.Tensor, torch.Tensor]
        | tuple[torch.Tensor | Fp8Activation, torch.Tensor]
    ):
        """Without residual: the normed x [T, hidden]. With one: (normed sum, residual),
        where `residual` has been updated in place to x + residual (rounded to the dtype)
        on every device; x itself is left unchanged. With `quantize` the normed rows come
        as an `Fp8Activation` (x must be [T, hidden])."""
        if self.fusable and kernels.enabled(x):
            from radixmesh.worker.layers.kernels import rms_norm as fused

            if quantize:
                if residual is None:
                    q, scale = fused.rms_norm_fp8(x, self.weight, self.eps)
                    return Fp8Activation(q, scale, x.dtype)
                q, scale = fused.fused_add_rms_norm_fp8(x, residual, self.weight, self.eps)
                return Fp8Activation(q, scale, x.dtype), residual
            if residual is None:
                return fused.rms_norm(x, self.weight, self.eps)
            return fused.fused_add_rms_norm(x, residual, self.weight, self.eps), residual
        if residual is None:
            out = self._norm(x)
            return Fp8Activation.quantize(out) if quantize else out
        out = self._norm(residual.add_(x))
        return (Fp8Activation.quantize(out) if quantize else out), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # One fused kernel (accumulates in float32 for half types); equal to the reference
        # formula bit for bit in float32 on CPU, within an ulp in bfloat16.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # [T, hidden]
