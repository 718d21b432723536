"""FP8 KV cache encoding: float8_e4m3fn values with a power-of-two scale per token and head.

Each new token's key (and value) vector of one KV head, x [D], is stored as
q = x / 2^e in e4m3 with e = ceil(log2(max|x| / 448)), the smallest exponent that keeps
every element within e4m3's finite range (no saturation), and e itself as one int8
beside the pool. Why this layout:

- Dynamic, per token and head: no calibration and no checkpoint scales; a token with
  outlier keys (large biases, attention sinks) costs only its own range, never others'.
- A power of two: multiplying by 2^e is exact in every float format, so the scale adds
  no rounding of its own; e4m3 is a floating-point format, so a scale only moves the
  range and the relative precision (3 mantissa bits) is the format's. Dequantized values
  are exactly representable in bfloat16, so kernels can dequantize straight into it.
- One byte of scale per D bytes of values: the pool holds 2D / (D + 1) times the
  tokens of a 16-bit pool (1.98x at head_dim 128, 1.97x at 64). Float32 scales would
  cost 4 bytes (1.88x at head_dim 64).

The alternative, one fixed scale per layer and head (1.0 or from the checkpoint), saves
the byte but saturates whatever exceeds 448 x scale; it needs calibrated scales to be safe.
The exponent is computed from float32 bits (exact ceil(log2)), and 2^e built from bits,
so the Triton store kernel and this reference agree bit for bit.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# Exponents stay where 2^e is a normal float32 (int8 holds them).
E_MIN, E_MAX = -126, 127


def scale_exponents(amax: torch.Tensor) -> torch.Tensor:
    """max|x| (any float dtype) -> int8 e = ceil(log2(max|x| / 448)), clamped to [-126, 127]."""
    bits = (amax.float() / FP8_MAX).view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    e = exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32)  # round up unless a power of two
    return e.clamp(E_MIN, E_MAX).to(torch.int8)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """int e in [-126, 127] -> float32 2^e, exactly (built from its bits)."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (e4m3 [..., D], int8 exponents [...]): x ~= q * 2^e."""
    x32 = x.float()
    e = scale_exponents(x32.abs().amax(dim=-1))
    q = (x32 * pow2(-e.to(torch.int32))[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, e


def dequantize_kv(q: torch.Tensor, e: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(e4m3 [..., D], exponents [...]) -> [..., D] in `dtype`."""
    return (q.float() * pow2(e)[..., None]).to(dtype)
