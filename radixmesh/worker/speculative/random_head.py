"""Random EAGLE heads written to disk in the checkpoint layout eagle_head.py reads: for
`dummy:` targets, what the tests and benchmarks draft with where no trained head exists
(their drafts are rarely kept; what they cost is the head's real work)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from radixmesh.worker.model.arch import LlamaArchConfig


def head_arch(target: LlamaArchConfig, **changes: Any) -> LlamaArchConfig:
    return target.replace(num_hidden_layers=1, **changes)


def random_head_weights(arch: LlamaArchConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """EAGLE names and shapes, float32; small enough that the layer's output stays O(1).
    With the tensors a head checkpoint carries that the loader reads past."""
    g = torch.Generator().manual_seed(seed)
    h, i, d = arch.hidden_size, arch.intermediate_size, arch.head_size
    hq, hkv = arch.num_attention_heads * d, arch.num_key_value_heads * d
    shapes = {
        "fc.weight": (h, 2 * h),
        "fc.bias": (h,),
        "layers.0.self_attn.q_proj.weight": (hq, h),
        "layers.0.self_attn.k_proj.weight": (hkv, h),
        "layers.0.self_attn.v_proj.weight": (hkv, h),
        "layers.0.self_attn.o_proj.weight": (h, hq),
        "layers.0.mlp.gate_proj.weight": (i, h),
        "layers.0.mlp.up_proj.weight": (i, h),
        "layers.0.mlp.down_proj.weight": (h, i),
    }
    out = {name: torch.randn(shape, generator=g) * 0.1 for name, shape in shapes.items()}
    out["layers.0.post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    out["layers.0.input_layernorm.weight"] = torch.ones(h)  # identity: read past
    out["embed_tokens.weight"] = torch.randn(arch.vocab_size, h, generator=g)  # the target's
    return out


def write_head(
    path: Path,
    arch: LlamaArchConfig,
    weights: dict[str, torch.Tensor] | None = None,
    seed: int = 0,
) -> Path:
    """A head directory (config.json + model.safetensors) for a target of `arch`."""
    path.mkdir(parents=True, exist_ok=True)
    head = head_arch(arch)
    (path / "config.json").write_text(json.dumps(head.to_hf_dict()))
    tensors = weights if weights is not None else random_head_weights(head, seed)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path
