"""A linear layer's input already quantized per token: what a fused norm or activation
kernel hands to an FP8 linear on the `_scaled_mm` path instead of its 16-bit rows.

x[t, :] ~= values[t, :] * scales[t], with scales[t] = max|x[t, :]| / 448 (at least
1e-12): `fp8_scales.quantize_rows` of the rows the producer would otherwise have
returned, bit for bit (quantization/fp8.py says when a producer is asked for it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixmesh.worker.layers.quantization.fp8_scales import FP8, dequantize_rows, quantize_rows


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, in] -> (FP8 [T, in], float32 [T]): `quantize_rows`, one kernel on CUDA."""
    from radixmesh.worker.layers import kernels

    if kernels.enabled(x) and x.stride(-1) == 1:
        from radixmesh.worker.layers.kernels.fp8_quant import per_token_fp8

        return per_token_fp8(x)
    return quantize_rows(x)


@dataclass(frozen=True)
class Fp8Activation:
    values: torch.Tensor  # [T, K] float8_e4m3fn
    scales: torch.Tensor  # [T] float32
    dtype: torch.dtype  # the rows' dtype before quantization: the GEMM's output dtype

    def __post_init__(self) -> None:
        if self.values.dtype != FP8 or self.values.dim() != 2:
            raise ValueError(f"values must be 2-D {FP8}, got {self.values.dtype} {self.shape}")
        if self.scales.dtype != torch.float32 or self.scales.shape != self.values.shape[:1]:
            raise ValueError(
                f"scales must be float32 [{self.values.shape[0]}], got "
                f"{self.scales.dtype} {tuple(self.scales.shape)}"
            )

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def device(self) -> torch.device:
        return self.values.device

    @classmethod
    def quantize(cls, x: torch.Tensor) -> Fp8Activation:
        """x [T, K] -> its per-token quantization (one kernel on CUDA)."""
        values, scales = quantize_per_token(x)
        return cls(values, scales, x.dtype)

    def dequantize(self) -> torch.Tensor:
        """values * scales in `dtype` (for tests and references)."""
        return dequantize_rows(self.values, self.scales, self.dtype)
