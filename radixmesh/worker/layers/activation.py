"""SiLU-gated linear unit over a fused [gate | up] projection.

On CUDA one Triton kernel (`layers/kernels/silu_mul.py`); elsewhere, and where
`kernels.enabled` is off, PyTorch ops, which are also the kernel's reference.

`quantize=True` (the next layer is an FP8 linear on the `_scaled_mm` path, which the
caller asked it: `PackableLinear.wants_fp8_input`) returns the product quantized per
token, an `Fp8Activation`: on CUDA one kernel writes e4m3 rows and their scales (bit for
bit the quantization of its 16-bit output), elsewhere the 16-bit output is quantized
after.
"""

from __future__ import annotations

from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers import kernels
from radixmesh.worker.layers.quantization.fp8_activation import Fp8Activation


class SiluAndMul(nn.Module):
    @overload
    def forward(
        self, gate_up: torch.Tensor, *, quantize: Literal[False] = False
    ) -> torch.Tensor: ...
    @overload
    def forward(self, gate_up: torch.Tensor, *, quantize: bool) -> torch.Tensor | Fp8Activation: ...
    def forward(
        self, gate_up: torch.Tensor, *, quantize: bool = False
    ) -> torch.Tensor | Fp8Activation:
        """gate_up [T, 2d] -> silu(gate) * up [T, d], or with `quantize` as an
        `Fp8Activation` (gate_up must be [T, 2d])."""
        if kernels.enabled(gate_up):
            from radixmesh.worker.layers.kernels import silu_mul as fused

            if quantize:
                q, scale = fused.silu_and_mul_fp8(gate_up)
                return Fp8Activation(q, scale, gate_up.dtype)
            return fused.silu_and_mul(gate_up)  # [T, d]
        d = gate_up.shape[-1] // 2
        out = F.silu(gate_up[..., :d]) * gate_up[..., d:]  # [T, d]
        return Fp8Activation.quantize(out) if quantize else out
