"""An EAGLE draft head (EAGLE-1/-2 checkpoints): one Llama decoder layer over the target
model's own features, and how such a checkpoint is read.

For a position i the head's input is `fc(concat(embed(t_{i+1}), f_i))`, where f_i is the
target's final-normed hidden state at i (what its lm_head reads) and embed is the
target's embedding; one decoder layer (no input norm: the first layer of these
checkpoints skips it; no final norm) gives h_i, whose logits through the target's
lm_head predict t_{i+2}, and h_i stands in for f_{i+1} at the next draft position.

Written as plain PyTorch modules under the checkpoint's own parameter names (`fc`,
`layers.0.self_attn.q_proj`, ...), not from the target's tensor-parallel layers: the head
is one layer run at small batch (only while speculation runs) and never sharded, so the
checkpoint loads with `load_state_dict` as it is. Attention is torch SDPA over the
head's own earlier keys (`past_k`/`past_v`, kept per request by the drafter) and the new
ones, causal; rotary uses the target's rope settings (these heads are trained on the
target's positions) at the head's head_dim.

Checkpoint directory: config.json (a Llama config: hidden_size and vocab_size must be the
target's; num_hidden_layers 1) and *.safetensors holding `fc.weight` [H, 2H], optionally
`fc.bias` [H], and `layers.0.*` (q/k/v/o_proj, gate/up/down_proj,
post_attention_layernorm). `embed_tokens.weight`, `lm_head.weight` and
`layers.0.input_layernorm.weight` may be present and are read past (the target's
embedding and lm_head are used; the input norm is identity).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from radixmesh.errors import InvalidArgument
from radixmesh.worker.layers.norm import RMSNorm
from radixmesh.worker.layers.rotary import RotaryEmbedding, apply_rotary
from radixmesh.worker.model.arch import LlamaArchConfig

FIELD = "speculative_draft_model"
# Tensors these checkpoints may carry that the head does not use.
_READ_PAST = ("embed_tokens.weight", "lm_head.weight", "layers.0.input_layernorm.weight")


class _Attention(nn.Module):
    def __init__(self, arch: LlamaArchConfig) -> None:
        super().__init__()
        h, d = arch.hidden_size, arch.head_size
        self.num_heads, self.num_kv_heads, self.head_dim = (
            arch.num_attention_heads,
            arch.num_key_value_heads,
            d,
        )
        bias = arch.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)


class _MLP(nn.Module):
    def __init__(self, arch: LlamaArchConfig) -> None:
        super().__init__()
        h, i = arch.hidden_size, arch.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, arch: LlamaArchConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(arch)
        self.mlp = _MLP(arch)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)


class EagleHead(nn.Module):
    def __init__(self, arch: LlamaArchConfig, target: LlamaArchConfig, fc_bias: bool) -> None:
        """`arch`: the head's config.json; `target`: the target model's (its rope)."""
        super().__init__()
        self.fc = nn.Linear(2 * arch.hidden_size, arch.hidden_size, bias=fc_bias)
        self.layers = nn.ModuleList([_Layer(arch)])
        self.rotary = RotaryEmbedding(
            arch.head_size,
            rope_theta=target.rope_theta,
            max_position=target.max_position_embeddings,
            rope_scaling=target.rope_scaling,
        )

    @property
    def layer(self) -> _Layer:
        layer = self.layers[0]
        assert isinstance(layer, _Layer)
        return layer

    def forward(
        self,
        embeds: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One request's new positions, in order after its `past_k`/`past_v` [P, Hkv, D].

        embeds, features: [T, H] (the next token's embedding, the position's feature);
        positions: [T] int64. Returns (h [T, H], k [T, Hkv, D], v [T, Hkv, D]): the layer's
        output, and the new positions' keys (rotated) and values to keep."""
        h, k, v = self.forward_batch(
            embeds[None], features[None], positions[None], past_k[None], past_v[None]
        )
        return h[0], k[0], v[0]

    def forward_batch(
        self,
        embeds: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        past_lens: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """B requests' new positions at once, each after its own history: row b's first
        past_lens[b] of past_k/past_v [B, P, Hkv, D] (None: all P; the rest padding,
        masked out).

        embeds, features: [B, T, H]; positions: [B, T]. A row with fewer than T new
        positions is padded at its end; a padded position's outputs are garbage that no
        valid one reads (each new position sees the new ones up to itself, causal). No
        mask at all where none is needed (one new position over equal histories: each
        draft step at batch 1). Returns (h [B, T, H], k, v [B, T, Hkv, D])."""
        layer = self.layer
        attn = layer.self_attn
        b, t, _ = embeds.shape
        d, p = attn.head_dim, past_k.shape[1]
        x = self.fc(torch.cat((embeds, features), dim=-1))  # [B, T, H]
        cos, sin = self.rotary(positions.reshape(-1))  # [B T, 1, D] each
        q = apply_rotary(attn.q_proj(x).view(b * t, attn.num_heads, d), cos, sin)
        k = apply_rotary(attn.k_proj(x).view(b * t, attn.num_kv_heads, d), cos, sin)
        q, k = q.view(b, t, attn.num_heads, d), k.view(b, t, attn.num_kv_heads, d)
        v = attn.v_proj(x).view(b, t, attn.num_kv_heads, d)
        keys, values = torch.cat((past_k, k), dim=1), torch.cat((past_v, v), dim=1)
        mask = None
        if t > 1 or (past_lens is not None and min(past_lens) < p):
            # Query j of row b sees its row's past keys and the new ones up to itself.
            lens = torch.tensor(past_lens or [p] * b, device=x.device)
            seen = torch.arange(p, device=x.device)[None, :] < lens[:, None]  # [B, P]
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()  # [T, T]
            both = (seen[:, None, :].expand(b, t, p), causal[None].expand(b, t, t))
            mask = torch.cat(both, dim=-1)[:, None]  # [B, 1, T, P + T]
        group = attn.num_heads // attn.num_kv_heads
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # [B, Hq, T, D]
            keys.repeat_interleave(group, dim=2).transpose(1, 2),  # [B, Hq, P + T, D]
            values.repeat_interleave(group, dim=2).transpose(1, 2),
            attn_mask=mask,
        )  # [B, Hq, T, D]
        h = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, attn.num_heads * d))
        h = h + layer.mlp(layer.post_attention_layernorm(h))  # [B, T, H]
        return h, k, v


def load_eagle_head(
    path: str | Path, target: LlamaArchConfig, dtype: torch.dtype, device: torch.device | str
) -> EagleHead:
    """The head in `path` on the target's device and dtype; a checkpoint that does not fit
    the target or lacks fc/layers.0 weights is an InvalidArgument naming the field."""
    path = Path(path)
    config = path / "config.json"
    if not config.is_file():
        raise InvalidArgument(FIELD, f"{path}: no config.json (an EAGLE head directory)")
    arch = LlamaArchConfig.from_hf_dict(json.loads(config.read_text()))
    for name in ("hidden_size", "vocab_size"):
        if getattr(arch, name) != getattr(target, name):
            raise InvalidArgument(
                FIELD,
                f"the head's {name} is {getattr(arch, name)}, the model's "
                f"{getattr(target, name)}: the head must be trained for this model",
            )
    weights = _read_weights(path)
    head = EagleHead(arch, target, fc_bias="fc.bias" in weights)
    expected = set(head.state_dict())
    missing = sorted(expected - set(weights))
    if missing:
        raise InvalidArgument(FIELD, f"{path}: missing weights: {', '.join(missing[:8])}")
    unexpected = sorted(set(weights) - expected)
    if unexpected:
        raise InvalidArgument(FIELD, f"{path}: unexpected weights: {', '.join(unexpected[:8])}")
    for name, tensor in weights.items():
        want = head.state_dict()[name].shape
        if tensor.shape != want:
            raise InvalidArgument(
                FIELD, f"{path}: {name} has shape {list(tensor.shape)}, expected {list(want)}"
            )
    head.load_state_dict(weights)
    return head.to(device=device, dtype=dtype).eval()


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise InvalidArgument(FIELD, f"{path} has no *.safetensors weights")
    out: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 -- safe_open handles are not iterable
                ours = name.removeprefix("model.")
                if ours not in _READ_PAST:
                    out[ours] = f.get_tensor(name)
    return out
