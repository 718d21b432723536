"""Building a model quantized to FP8: every decoder linear and every sparse layer's experts
are handed to the method (the same set a whole-model pass finds), and on a GPU the
full-precision weights construction allocates exist for one decoder layer at a time, so
the peak while building stays near the quantized model's size."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.layers.moe import SparseMoE
from radixmesh.worker.layers.quantization import quantizable_layers
from radixmesh.worker.layers.quantization.fp8_scales import FP8
from radixmesh.worker.model.arch import PRESETS
from radixmesh.worker.model.llama import LlamaForCausalLM


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_every_decoder_linear_and_expert_is_fp8(preset: str) -> None:
    arch = PRESETS[preset]
    model = LlamaForCausalLM(arch, dtype=torch.bfloat16, quantization="fp8")
    linears = quantizable_layers(model)
    # q/k/v and gate/up are packed: 4 linears a dense layer, 2 (qkv, o) a sparse one
    per_layer = 2 if arch.num_experts else 4
    assert len(linears) == per_layer * arch.num_hidden_layers
    assert all(layer.weight.dtype == FP8 for layer in linears)
    experts = [m for m in model.modules() if isinstance(m, SparseMoE)]
    assert len(experts) == (arch.num_hidden_layers if arch.num_experts else 0)
    assert all(m.w13.dtype == FP8 and m.w2.dtype == FP8 for m in experts)
    # the embeddings and the LM head keep the model's dtype
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_build_peak_is_one_layer_of_full_precision() -> None:
    # 8 layers of ~100 MB of bf16 linears each: the quantized model is ~0.5 of it
    arch = PRESETS["tiny"].replace(
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=16,
        num_key_value_heads=8,
        num_hidden_layers=8,
        vocab_size=1024,
    )
    device = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    model = LlamaForCausalLM(arch, dtype=torch.bfloat16, device=device, quantization="fp8")
    peak = torch.cuda.max_memory_allocated(device) - base
    held = torch.cuda.memory_allocated(device) - base
    layer_bf16 = sum(
        2 * p.numel() for name, p in model.model.layers[0].named_parameters() if "weight" in name
    )
    assert held < 0.6 * 8 * layer_bf16  # FP8 linears: about half
    # built layer by layer: the peak is what is held plus about one layer in bf16
    assert peak <= held + 1.1 * layer_bf16
