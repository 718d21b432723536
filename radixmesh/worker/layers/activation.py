"""SiLU-gated linear unit over a fused [gate | up] projection.

On CUDA one Triton kernel (`layers/kernels/silu_mul.py`); elsewhere, and where
`kernels.enabled` is off, PyTorch ops, which are also the kernel's reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers import kernels


class SiluAndMul(nn.Module):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if kernels.enabled(gate_up):
            from radixmesh.worker.layers.kernels.silu_mul import silu_and_mul

            return silu_and_mul(gate_up)  # [T, d]
        d = gate_up.shape[-1] // 2
        return F.silu(gate_up[..., :d]) * gate_up[..., d:]  # [T, d]
