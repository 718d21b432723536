"""RMSNorm (Llama): x / sqrt(mean(x^2) + eps) * weight, statistics in float32.

With a residual, the norm first adds its input into the residual stream (vLLM-style
pre-norm): residual <- x + residual, in place, then normalizes the sum. On CUDA both run
as one Triton kernel (`layers/kernels/rms_norm.py`); elsewhere, and where
`kernels.enabled` is off, as PyTorch ops, which are also the kernel's reference.
"""

from __future__ import annotations

from typing import overload

import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers import kernels
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
    def forward(self, x: torch.Tensor, residual: None = None) -> torch.Tensor: ...
    @overload
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without residual: the normed x [T, hidden]. With one: (normed sum, residual),
        where `residual` has been updated in place to x + residual (rounded to the dtype)
        on every device; x itself is left unchanged."""
        if self.fusable and kernels.enabled(x):
            from radixmesh.worker.layers.kernels import rms_norm as fused

            if residual is None:
                return fused.rms_norm(x, self.weight, self.eps)
            return fused.fused_add_rms_norm(x, residual, self.weight, self.eps), residual
        if residual is None:
            return self._norm(x)
        return self._norm(residual.add_(x)), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # One fused kernel (accumulates in float32 for half types); equal to the reference
        # formula bit for bit in float32 on CPU, within an ulp in bfloat16.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # [T, hidden]
