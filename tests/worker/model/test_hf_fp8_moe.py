"""FP8 checkpoints of mixtures of experts, as Qwen3-30B-A3B-FP8 ships them: every
projection (attention's and each expert's) in e4m3 with 128 x 128 block scales
(`weight_scale_inv`), the router and the norms in full precision. The attention layers
load as FP8 layers, the experts as FP8 experts (layers/moe.py: the checkpoint's bits, its
scales in blocks). The logits are those of the model holding the dequantized weights, in
whatever order the files give a weight and its scale. And a full-precision mixture of
experts quantized at load: FP8 experts within e4m3's rounding of its weights."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from radixmesh.worker.engine import Engine
from radixmesh.worker.layers.moe import SparseMoE
from radixmesh.worker.layers.quantization import dequantize_linears
from radixmesh.worker.layers.quantization.fp8_experts import dequantize
from radixmesh.worker.layers.quantization.fp8_scales import (
    FP8,
    dequantize_checkpoint_weight,
    quantize_blocks,
)
from radixmesh.worker.model import loader
from radixmesh.worker.model.arch import LlamaArchConfig
from radixmesh.worker.model.llama import LlamaDecoderLayer, LlamaForCausalLM
from tests.worker.model.helpers import (
    RaggedRunner,
    checkpoint_tensors,
    make_pair,
    random_ids,
    write_tokenizer,
)

BLOCK_CONFIG = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}
# Wider than the helpers' defaults, so the blocks have several column groups and partial
# blocks at the edges: hidden 192 (groups of 128 and 64), experts of 160 (the same).
SIZES = {"hidden_size": 192, "moe_intermediate_size": 160}
# Attention's, the dense and Qwen's experts' projections, Mixtral's experts' names.
PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
PROJECTIONS |= {"w1", "w2", "w3"}


def fp8_checkpoint(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in tensors.items():
        if name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS:
            out[name], out[name + "_scale_inv"] = quantize_blocks(t, 128)
        else:
            out[name] = t
    return out


def dequantized(ckpt: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        name: dequantize_checkpoint_weight(t, ckpt[name + "_scale_inv"]) if t.dtype == FP8 else t
        for name, t in ckpt.items()
        if not name.endswith("_scale_inv")
    }


def save(path: Path, config: dict[str, object], ckpt: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    (path / "config.json").write_text(json.dumps({**config, "quantization_config": BLOCK_CONFIG}))
    save_file(ckpt, str(path / "model.safetensors"))


@pytest.mark.parametrize("variant", ["qwen3-moe", "mixtral", "qwen2-moe"])
@pytest.mark.parametrize("sliced", [False, True], ids=["tensors", "lazy-slices"])
def test_fp8_moe_checkpoint_logits_equal_the_dequantized_model(
    tmp_path: Path, variant: str, sliced: bool
) -> None:
    settings = SIZES if variant != "mixtral" else {"hidden_size": 192, "intermediate_size": 160}
    hf, _ = make_pair(variant, seed=4, **settings)
    arch = LlamaArchConfig.from_hf_dict(hf.config.to_dict())
    ckpt = fp8_checkpoint(checkpoint_tensors(hf, arch))
    save(tmp_path, hf.config.to_dict(), ckpt)
    assert loader.load_quantization(str(tmp_path)) == "fp8-128x128"
    arch = loader.load_arch_config(str(tmp_path))
    model = LlamaForCausalLM(arch, quantization="fp8-128x128")
    model.load_weights(loader.iter_weights(str(tmp_path), arch, dtype=torch.float32, sliced=sliced))
    reference = LlamaForCausalLM(arch)
    reference.load_weights(dequantized(ckpt).items())
    # The attention layers and the experts hold the checkpoint's FP8 bits.
    layer = model.model.layers[0]
    assert isinstance(layer, LlamaDecoderLayer)
    assert layer.self_attn.qkv_proj.weight.dtype == FP8
    moe, ref_moe = layer.mlp, reference.model.layers[0].mlp
    assert isinstance(moe, SparseMoE) and isinstance(ref_moe, SparseMoE)
    block, gate, _, down = arch.expert_names
    expert = f"model.layers.0.{block}.experts.3"
    assert moe.w13.dtype == FP8 and moe.w2.dtype == FP8
    assert torch.equal(_bits(moe.w13[3, :160]), _bits(ckpt[f"{expert}.{gate}.weight"]))
    assert torch.equal(_bits(moe.w2[3]), _bits(ckpt[f"{expert}.{down}.weight"]))
    # I = 160 puts up's rows mid-block: w13's scales per row; w2 keeps 128 x 128 blocks.
    assert moe.blocks == ((1, 128), (128, 128))
    scales = moe.scales()
    assert scales is not None and tuple(moe.w2_scale.shape) == (arch.num_experts, 2, 2)
    for w, scale, ref in zip((moe.w13, moe.w2), scales, (ref_moe.w13, ref_moe.w2), strict=True):
        assert torch.equal(dequantize(w, scale), ref)
    ids = random_ids(40, seed=3)
    ours = RaggedRunner(model).step([(0, ids)])[0]
    theirs = RaggedRunner(reference).step([(0, ids)])[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def test_a_scale_before_its_weight_and_one_missing() -> None:
    """Files may hold an expert's scale before its weight (a sharded checkpoint's index
    orders them by name only within a file); a weight whose scale never comes, or a scale
    whose weight never comes, is an error naming it."""
    hf, _ = make_pair("qwen3-moe", seed=5, **SIZES)
    arch = LlamaArchConfig.from_hf_dict(hf.config.to_dict())
    ckpt = {
        # as model/hf.py yields them: weight_scale_inv renamed weight_scale
        name.removesuffix("_inv"): t
        for name, t in fp8_checkpoint(checkpoint_tensors(hf, arch)).items()
    }
    reversed_order = list(reversed(ckpt.items()))
    model = LlamaForCausalLM(arch, quantization="fp8-128x128")
    model.load_weights(reversed_order)  # every scale first
    expert = "model.layers.0.mlp.experts.2.up_proj.weight"
    for missing, message in ((expert + "_scale", " (no scale)"), (expert, "_scale (no weight)")):
        model = LlamaForCausalLM(arch, quantization="fp8-128x128")
        with pytest.raises(ValueError, match=re.escape(f"without their pair: {expert}{message}")):
            model.load_weights((n, t) for n, t in ckpt.items() if n != missing)


def test_an_engine_serves_an_fp8_moe_checkpoint(tmp_path: Path) -> None:
    """The directory as users point at it: the engine takes the checkpoint's layout and
    decodes greedily what the dequantized model's logits pick first."""
    hf, _ = make_pair("qwen3-moe", seed=6, **SIZES)
    arch = LlamaArchConfig.from_hf_dict(hf.config.to_dict())
    ckpt = fp8_checkpoint(checkpoint_tensors(hf, arch))
    save(tmp_path, hf.config.to_dict(), ckpt)
    write_tokenizer(tmp_path, hf.config.vocab_size)
    reference = LlamaForCausalLM(arch)
    reference.load_weights(dequantized(ckpt).items())
    prompt = random_ids(12, seed=7)
    logits = RaggedRunner(reference).step([(0, prompt)])[0][-1]
    top2 = logits.topk(2).values
    assert float(top2[0] - top2[1]) > 1e-3  # no near tie for the first token
    engine = Engine(str(tmp_path), dtype="float32", kv_cache_tokens=512, max_running_requests=2)
    try:
        assert engine.worker.quantization == "fp8-128x128"
        out = engine.generate(
            input_ids=prompt,
            sampling_params={"temperature": 0, "max_new_tokens": 1, "ignore_eos": True},
        )
        assert isinstance(out, dict) and out["output_ids"] == [int(logits.argmax())]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("method", ["fp8", "fp8-128x128"])
def test_a_bf16_moe_quantized_at_load_holds_fp8_experts_within_rounding(method: str) -> None:
    """`dummy:tiny-moe` in bfloat16 with quantization named: the experts in e4m3 (per row
    with "fp8", in the checkpoint's 128 x 128 blocks with "fp8-128x128": one block, the
    experts being 64 wide), each value within half an e4m3 step of the bfloat16 weight
    (2^-4 of the value, 2^-10 of its scale among subnormals); the logits near the bf16
    model's, and a CPU worker's dequantized model gives the FP8 model's exactly."""
    arch = loader.load_arch_config("dummy:tiny-moe")
    weights = dict(loader.iter_weights("dummy:tiny-moe", arch, dtype=torch.bfloat16))
    model = LlamaForCausalLM(arch, dtype=torch.bfloat16, quantization=method)
    model.load_weights(weights.items())
    reference = LlamaForCausalLM(arch, dtype=torch.bfloat16)
    reference.load_weights(weights.items())
    for layer, ref_layer in zip(model.model.layers, reference.model.layers, strict=True):
        moe, ref_moe = layer.mlp, ref_layer.mlp
        assert isinstance(moe, SparseMoE) and isinstance(ref_moe, SparseMoE)
        assert moe.w13.dtype == FP8 and moe.w2.dtype == FP8
        scales = moe.scales()
        assert scales is not None
        blocks = ((1, 64), (1, 32)) if method == "fp8" else ((1, 128), (128, 128))
        assert moe.blocks == blocks
        for w, scale, ref in zip((moe.w13, moe.w2), scales, (ref_moe.w13, ref_moe.w2), strict=True):
            want = ref.float()
            per_element = dequantize(torch.ones_like(w), scale)
            err = (dequantize(w, scale) - want).abs()
            assert bool((err <= 2**-4 * want.abs() + 2**-10 * per_element).all())
            assert bool((err > 0).any())  # quantized, not copied
    ids = random_ids(24, seed=8)
    ours = RaggedRunner(model).step([(0, ids)])[0]
    theirs = RaggedRunner(reference).step([(0, ids)])[0]
    # e4m3 (3 mantissa bits) against bfloat16: close, not equal
    diff = float((ours - theirs).abs().max()) / float(theirs.abs().max())
    assert 0 < diff < 0.1
    dequantize_linears(model, torch.bfloat16)
    assert torch.equal(RaggedRunner(model).step([(0, ids)])[0], ours)
