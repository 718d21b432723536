"""Rotary embedding against transformers' Llama rotary code (frequencies and rotation)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from radixmesh.worker.layers.rotary import RotaryEmbedding, apply_rotary, rope_inv_freq

HEAD_DIM = 32
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}
SCALINGS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": LLAMA3,
    "legacy-type-key": {"type": "linear", "factor": 2.0},
}


def hf_rotary(theta: float, scaling: dict[str, Any] | None) -> LlamaRotaryEmbedding:
    params = {"rope_theta": theta, "rope_type": "default", **(scaling or {})}
    if "type" in params:
        params["rope_type"] = params.pop("type")
    config = transformers.LlamaConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        max_position_embeddings=4096,
        rope_parameters=params,
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_frequencies_match_transformers(name: str) -> None:
    ref = hf_rotary(500000.0, SCALINGS[name]).inv_freq
    assert torch.equal(rope_inv_freq(HEAD_DIM, 500000.0, SCALINGS[name]), ref)


def test_llama3_scaling_changes_only_long_wavelengths() -> None:
    plain, scaled = rope_inv_freq(HEAD_DIM, 500000.0), rope_inv_freq(HEAD_DIM, 500000.0, LLAMA3)
    assert scaled[0] == plain[0]  # shortest wavelength kept
    torch.testing.assert_close(scaled[-1], plain[-1] / 8)  # longest divided by factor
    between = (scaled != plain) & (scaled != plain / 8)
    assert between.any()  # a smooth ramp in between


@pytest.mark.parametrize("name", ["default", "llama3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotation_matches_transformers(name: str, dtype: torch.dtype) -> None:
    positions = torch.tensor([0, 1, 5, 300, 4095, 17])
    q, k = torch.randn(6, 4, HEAD_DIM, dtype=dtype), torch.randn(6, 2, HEAD_DIM, dtype=dtype)
    ours = RotaryEmbedding(
        HEAD_DIM, rope_theta=10000.0, max_position=4096, rope_scaling=SCALINGS[name], dtype=dtype
    )
    cos, sin = hf_rotary(10000.0, SCALINGS[name])(q, positions[None])  # [1, T, D]
    # transformers wants [B, H, T, D]; ours is [T, H, D].
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    cos_sin = ours(positions)
    assert torch.equal(apply_rotary(q, *cos_sin), q_ref[0].transpose(0, 1))
    assert torch.equal(apply_rotary(k, *cos_sin), k_ref[0].transpose(0, 1))


def test_unsupported_scaling_is_rejected() -> None:
    with pytest.raises(ValueError, match="rope_scaling: rope_type 'longrope' is not supported"):
        rope_inv_freq(HEAD_DIM, 10000.0, {"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match=r"rope_scaling\.original_max_position_embeddings"):
        rope_inv_freq(HEAD_DIM, 10000.0, {"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match=r"rope_scaling\.low_freq_factor: missing"):
        rope_inv_freq(HEAD_DIM, 10000.0, {"rope_type": "llama3", "factor": 2.0})


def test_qk_norm_without_rotation_only_normalizes() -> None:
    """A layer that attends without position encoding (nope) in a model with q/k norms:
    the heads are normed and not rotated, and rotating them would change them."""
    from radixmesh.worker.layers.norm import RMSNorm
    from radixmesh.worker.layers.rotary import norm_rotary_

    t, h, hkv, d = 3, 4, 2, HEAD_DIM
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(t, h + hkv, d, generator=gen)
    q_norm, k_norm = RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
    q_norm.weight.data.copy_(torch.rand(d, generator=gen) + 0.5)
    k_norm.weight.data.copy_(torch.rand(d, generator=gen) + 0.5)
    cos, sin = RotaryEmbedding(d, rope_theta=10000.0, max_position=64)(torch.tensor([5, 9, 31]))
    normed = torch.cat(
        [
            q_norm(x[:, :h].reshape(-1, d)).view(t, h, d),
            k_norm(x[:, h:].reshape(-1, d)).view(t, hkv, d),
        ],
        dim=1,
    )
    got = norm_rotary_(x.clone(), h, q_norm, k_norm, cos, sin, rotate=False)
    assert torch.equal(got, normed)
    rotated = norm_rotary_(x.clone(), h, q_norm, k_norm, cos, sin)
    assert torch.equal(rotated, apply_rotary(normed, cos, sin))
    assert not torch.allclose(rotated, normed, atol=1e-3)
