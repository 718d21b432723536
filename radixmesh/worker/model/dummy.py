"""`dummy:<preset>` models: real shapes, random weights, a byte tokenizer.

For GPU benchmarks where no weights can be downloaded, and for fast tests (`dummy:tiny`).
Weights are created directly on the target device, one tensor at a time, so a 70B preset
never needs host memory for the whole model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch

from radixmesh.errors import InvalidArgument
from radixmesh.worker.model.arch import PRESETS, LlamaArchConfig

INIT_STD = 0.02


LAYERS_SUFFIX = "@layers="


def preset_arch(preset: str) -> LlamaArchConfig:
    """A preset by name; `<preset>@layers=N` keeps its shape with N layers (benchmarks
    of a model too large for the machine, stated as such)."""
    name, _, layers = preset.partition(LAYERS_SUFFIX)
    if name not in PRESETS:
        raise InvalidArgument(
            "model", f"unknown dummy preset {name!r}; presets: {', '.join(sorted(PRESETS))}"
        )
    if not layers:
        return PRESETS[name]
    if not layers.isdigit() or int(layers) < 1:
        raise InvalidArgument(
            "model", f"{LAYERS_SUFFIX}: expected a layer count >= 1, got {layers!r}"
        )
    return PRESETS[name].replace(num_hidden_layers=int(layers))


def parameter_shapes(arch: LlamaArchConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the model under its Hugging Face name, in checkpoint order."""
    h, d = arch.hidden_size, arch.head_size
    q_rows, kv_rows = arch.num_attention_heads * d, arch.num_key_value_heads * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, h)}
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q_rows, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv_rows, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv_rows, h)
        if arch.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q_rows,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_rows,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_rows,)
        if arch.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q_rows)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if arch.is_sparse_layer(i):
            block, gate, up, down = arch.expert_names
            e_size = arch.expert_size
            shapes[f"{p}{block}.gate.weight"] = (arch.num_experts, h)
            for e in range(arch.num_experts):
                shapes[f"{p}{block}.experts.{e}.{gate}.weight"] = (e_size, h)
                shapes[f"{p}{block}.experts.{e}.{up}.weight"] = (e_size, h)
                shapes[f"{p}{block}.experts.{e}.{down}.weight"] = (h, e_size)
            if s_size := arch.shared_expert_intermediate_size:
                shapes[f"{p}mlp.shared_expert.gate_proj.weight"] = (s_size, h)
                shapes[f"{p}mlp.shared_expert.up_proj.weight"] = (s_size, h)
                shapes[f"{p}mlp.shared_expert.down_proj.weight"] = (h, s_size)
                shapes[f"{p}mlp.shared_expert_gate.weight"] = (1, h)
            continue
        shapes[p + "mlp.gate_proj.weight"] = (arch.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (arch.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, arch.intermediate_size)
    shapes["model.norm.weight"] = (h,)
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, h)
    return shapes


def iter_dummy_weights(
    arch: LlamaArchConfig, *, dtype: torch.dtype, device: torch.device | str, seed: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Random weights: N(0, 0.02) matrices, ones for norms, zeros for biases.

    Each tensor has its own generator seeded from (seed, name), so a tensor's values do not
    depend on which other tensors were created before it.
    """
    for name, shape in parameter_shapes(arch).items():
        if name.endswith("norm.weight"):
            yield name, torch.ones(shape, dtype=dtype, device=device)
        elif name.endswith(".bias"):
            yield name, torch.zeros(shape, dtype=dtype, device=device)
        else:
            gen = torch.Generator(device=device).manual_seed(_tensor_seed(seed, name))
            out = torch.empty(shape, dtype=dtype, device=device)
            yield name, out.normal_(0.0, INIT_STD, generator=gen)


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed wants a non-negative int64
