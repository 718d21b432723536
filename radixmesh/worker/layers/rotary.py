"""Rotary position embedding (RoPE), Hugging Face "rotate half" layout.

Head dims [0, D/2) and [D/2, D) form the pairs rotated by angle position * inv_freq[i].
Supported `rope_scaling` types: none/"default", "linear" (positions divided by `factor`),
"llama3" (Llama 3.1: long wavelengths divided by `factor`, a smooth ramp between
`high_freq_factor` and `low_freq_factor`) and "yarn" (YaRN, as Qwen's long-context
configs and transformers compute it: frequencies blended between interpolated and kept
over a ramp of dims set by `beta_fast`/`beta_slow`, and cos/sin scaled by an attention
factor). Anything else is rejected at construction.

cos/sin are tabulated once for every position up to `max_position` in the model dtype
(as the reference rounds them); the model looks them up once per step and every layer
reuses them. `apply_rotary_` is what the model calls: on CUDA one Triton kernel that
rotates in place (`layers/kernels/rotary.py`), elsewhere `apply_rotary`'s PyTorch ops,
which are also the kernel's reference. `norm_rotary_` does the same after Qwen3's
per-head q and k norms, one kernel on CUDA.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from radixmesh.worker.layers import kernels
from radixmesh.worker.layers.norm import RMSNorm


def rope_inv_freq(
    head_dim: int, rope_theta: float, rope_scaling: dict[str, Any] | None = None
) -> torch.Tensor:
    """The rotation frequency of each dim pair, [head_dim // 2] float32."""
    return rope_parameters(head_dim, rope_theta, rope_scaling)[0]


def rope_parameters(
    head_dim: int, rope_theta: float, rope_scaling: dict[str, Any] | None = None
) -> tuple[torch.Tensor, float]:
    """The rotation frequency of each dim pair, [head_dim // 2] float32, and the factor
    cos/sin are scaled by (YaRN's attention factor; 1 otherwise)."""
    # float32 on purpose: the reference computes it so; float64 would shift angles at
    # large positions by more than the test tolerance.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (rope_theta**exponents)
    rope_type = _rope_type(rope_scaling)
    if rope_type == "default":
        return inv_freq, 1.0
    assert rope_scaling is not None
    factor = float(_require(rope_scaling, "factor"))
    if rope_type == "linear":
        return inv_freq / factor, 1.0
    if rope_type == "yarn":
        return _yarn(head_dim, rope_theta, factor, rope_scaling)
    return _llama3_inv_freq(inv_freq, factor, rope_scaling), 1.0


def _rope_type(rope_scaling: dict[str, Any] | None) -> str:
    if not rope_scaling:
        return "default"
    rope_type = str(rope_scaling.get("rope_type", rope_scaling.get("type", "default")))
    if rope_type not in ("default", "linear", "llama3", "yarn"):
        raise ValueError(
            f"rope_scaling: rope_type {rope_type!r} is not supported "
            "(supported: default, linear, llama3, yarn)"
        )
    return rope_type


def _require(rope_scaling: dict[str, Any], key: str) -> Any:
    if key not in rope_scaling:
        raise ValueError(f"rope_scaling.{key}: missing")
    return rope_scaling[key]


def _llama3_inv_freq(
    inv_freq: torch.Tensor, factor: float, rope_scaling: dict[str, Any]
) -> torch.Tensor:
    low = float(_require(rope_scaling, "low_freq_factor"))
    high = float(_require(rope_scaling, "high_freq_factor"))
    old_context = float(_require(rope_scaling, "original_max_position_embeddings"))
    wavelen = 2 * math.pi / inv_freq  # [D/2]
    # 0 for long wavelengths (fully scaled), 1 for short ones (kept), a ramp in between.
    smooth = ((old_context / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def _yarn(
    dim: int, base: float, factor: float, rope_scaling: dict[str, Any]
) -> tuple[torch.Tensor, float]:
    """YaRN's frequencies and attention factor, as transformers computes them."""
    old_context = float(_require(rope_scaling, "original_max_position_embeddings"))
    attention = rope_scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
        if mscale and mscale_all:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention = _yarn_mscale(factor)
    beta_fast = rope_scaling.get("beta_fast") or 32
    beta_slow = rope_scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:  # the dim that turns `rotations` times
        return (dim * math.log(old_context / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope_scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    kept = 1 - ramp  # 1: extrapolate (the frequency kept), 0: interpolate (divided)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - kept) + (1.0 / pos_freqs) * kept
    return inv_freq, float(attention)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        head_dim: int,
        *,
        rope_theta: float,
        max_position: int,
        rope_scaling: dict[str, Any] | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        inv_freq, attention = rope_parameters(head_dim, rope_theta, rope_scaling)
        positions = torch.arange(max_position, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)  # [P, D/2]
        cos, sin = angles.cos(), angles.sin()
        if attention != 1.0:  # YaRN: scaled in float32, then rounded, as the reference
            cos, sin = cos * attention, sin * attention
        # Full-width tables so that apply_rotary is two multiplies and an add; sin carries
        # the sign of the rotation: out = x * cos + [x2 | x1] * [-sin | sin].
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer(
            "cos", torch.cat((cos, cos), -1).to(dtype=dtype, device=device), persistent=False
        )  # [P, D]
        self.register_buffer(
            "sin", torch.cat((-sin, sin), -1).to(dtype=dtype, device=device), persistent=False
        )  # [P, D]

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for `positions` [T], each [T, 1, D] (broadcast over heads)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, D] by the angles of cos/sin [T, 1, D] from RotaryEmbedding."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)  # [T, H, D]: [x2 | x1]
    return x * cos + swapped * sin


def apply_rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rotary` that may overwrite x: the fused CUDA kernel rotates x [T, H, D] in
    place (any token/head strides, e.g. q and k inside the fused qkv output) and returns
    it; the PyTorch path returns a new tensor. Use the result; do not read x afterwards."""
    if kernels.enabled(x):
        from radixmesh.worker.layers.kernels.rotary import rotary_

        rotary_(x, cos, sin)
        return x
    return apply_rotary(x, cos, sin)


def norm_rotary_(
    x: torch.Tensor,
    num_q_heads: int,
    q_norm: RMSNorm,
    k_norm: RMSNorm,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotate: bool = True,
) -> torch.Tensor:
    """Qwen3's q and k norms, then rotary: x [T, Hq + Hkv, D] (q heads first), each q head
    normed by `q_norm` and each k head by `k_norm` (RMSNorm over the head size), then
    rotated (not where `rotate` is False: a layer without position encoding). On CUDA one
    kernel in place (x returned); elsewhere, and without rotation, the norms' and
    `apply_rotary`'s PyTorch ops, a new tensor. Use the result; do not read x afterwards."""
    if rotate and kernels.enabled(x) and q_norm.eps == k_norm.eps:
        from radixmesh.worker.layers.kernels.rotary import norm_rotary_ as fused

        fused(x, num_q_heads, q_norm.weight, k_norm.weight, q_norm.eps, cos, sin)
        return x
    t, h, d = x.shape
    q = q_norm(x[:, :num_q_heads].reshape(t * num_q_heads, d)).view(t, num_q_heads, d)
    k = k_norm(x[:, num_q_heads:].reshape(t * (h - num_q_heads), d)).view(t, -1, d)
    qk = torch.cat([q, k], dim=1)
    return apply_rotary(qk, cos, sin) if rotate else qk
