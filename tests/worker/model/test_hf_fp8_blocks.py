"""Loading block-scaled FP8 checkpoints as DeepSeek-V3 / Qwen FP8 ship them: e4m3 weights
with `weight_scale_inv` [ceil(out/128), ceil(in/128)] and quantization_config
{"quant_method": "fp8", "weight_block_size": [128, 128]}. Values land bit for bit, the
scales repeated on their block's rows, and the logits are those of the float32 model
holding the dequantized weights.

The model is dummy:tiny's with wider layers (hidden 192, intermediate 320): tiny's 64 and
128 input columns would make every block scale a per-row one, and these sizes give
several column groups, partial groups at the edges, and k/v pieces of 96 rows whose
block of 128 rows is partial.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.worker.layers.quantization.fp8_scales import (
    FP8,
    dequantize_rows,
    quantize_blocks,
    rows_of_blocks,
)
from radixmesh.worker.model import loader
from radixmesh.worker.model.arch import PRESETS
from radixmesh.worker.model.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from tests.worker.model.helpers import RaggedRunner, random_ids

ARCH = PRESETS["tiny"].replace(hidden_size=192, intermediate_size=320)
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK_CONFIG = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


def random_state(seed: int) -> dict[str, torch.Tensor]:
    """Full-precision weights under HF names, from our own float32 model's shapes."""
    model = LlamaForCausalLM(ARCH)
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            state[name] = 1 + 0.2 * torch.randn(p.shape, generator=gen)
        else:
            state[name] = 0.15 * torch.randn(p.shape, generator=gen)
    # Our fused parameters back to the checkpoint's tensors.
    out = {}
    for name, t in state.items():
        if "qkv_proj" in name:
            q, k, v = t.split([192, 96, 96])
            for part, tensor in zip(("q_proj", "k_proj", "v_proj"), (q, k, v), strict=True):
                out[name.replace("qkv_proj", part)] = tensor.contiguous()
        elif "gate_up_proj" in name:
            gate, up = t.chunk(2)
            out[name.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
            out[name.replace("gate_up_proj", "up_proj")] = up.contiguous()
        else:
            out[name] = t
    return out


def block_checkpoint(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in state.items():
        if name.endswith(".weight") and name.split(".")[-2] in QUANTIZED:
            q, scale_inv = quantize_blocks(t, 128)
            out[name], out[name + "_scale_inv"] = q, scale_inv
        else:
            out[name] = t
    return out


def dequantized(ckpt: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in ckpt.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == FP8:
            scale = rows_of_blocks(ckpt[name + "_scale_inv"], t.shape[0])
            out[name] = dequantize_rows(t, scale, torch.float32)
        else:
            out[name] = t
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    from safetensors.torch import save_file

    ckpt = block_checkpoint(random_state(seed=0))
    path = tmp_path_factory.mktemp("fp8-blocks")
    config = {**ARCH.to_hf_dict(), "quantization_config": BLOCK_CONFIG}
    (path / "config.json").write_text(json.dumps(config))
    save_file(ckpt, str(path / "model.safetensors"))
    return path, ckpt


@pytest.mark.parametrize("sliced", [False, True], ids=["tensors", "lazy-slices"])
def test_block_checkpoint_loads_values_and_scales_unchanged(
    checkpoint: tuple[Path, dict[str, torch.Tensor]], sliced: bool
) -> None:
    path, ckpt = checkpoint
    assert loader.load_quantization(str(path)) == "fp8-128x128"
    arch = loader.load_arch_config(str(path))
    model = LlamaForCausalLM(arch, quantization="fp8-128x128")
    model.load_weights(loader.iter_weights(str(path), arch, dtype=torch.float32, sliced=sliced))
    layer = model.model.layers[1]
    assert isinstance(layer, LlamaDecoderLayer) and isinstance(layer.mlp, LlamaMLP)
    qkv = layer.self_attn.qkv_proj
    names = [f"model.layers.1.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj")]
    stored = torch.cat([ckpt[n] for n in names])
    assert torch.equal(qkv.weight.view(torch.uint8), stored.view(torch.uint8))
    # q's 192 rows: blocks of 128 and 64; k's and v's 96 rows: one partial block each.
    rows = (192, 96, 96)
    scales = [rows_of_blocks(ckpt[n + "_scale_inv"], r) for n, r in zip(names, rows, strict=True)]
    assert qkv.weight_scale.shape == (384, 2)
    assert torch.equal(qkv.weight_scale, torch.cat(scales))
    down = layer.mlp.down_proj  # 320 input columns: groups of 128, 128 and 64
    scale_inv = ckpt["model.layers.1.mlp.down_proj.weight_scale_inv"]
    assert scale_inv.shape == (2, 3)
    assert torch.equal(down.weight_scale, rows_of_blocks(scale_inv, 192))


@pytest.mark.parametrize("quantization", ["fp8-128x128", "fp8-1x128"])
def test_block_checkpoint_logits_equal_the_dequantized_model(
    checkpoint: tuple[Path, dict[str, torch.Tensor]], quantization: str
) -> None:
    # fp8-1x128 layers hold the same numbers: block scales repeated on rows.
    path, ckpt = checkpoint
    arch = loader.load_arch_config(str(path))
    model = LlamaForCausalLM(arch, quantization=quantization)
    model.load_weights(loader.iter_weights(str(path), arch, dtype=torch.float32))
    reference = LlamaForCausalLM(arch)
    reference.load_weights(dequantized(ckpt).items())
    ids = random_ids(40, seed=3)
    ours = RaggedRunner(model).step([(0, ids)])[0]
    theirs = RaggedRunner(reference).step([(0, ids)])[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_per_channel_layers_refuse_block_scales(
    checkpoint: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    path, _ = checkpoint
    arch = loader.load_arch_config(str(path))
    model = LlamaForCausalLM(arch, quantization="fp8")  # per channel
    with pytest.raises(ValueError, match=r"weight_scale'?: block scales"):
        model.load_weights(loader.iter_weights(str(path), arch, dtype=torch.float32))


def test_other_block_sizes_name_the_model_field(
    checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    path, _ = checkpoint
    config = json.loads((path / "config.json").read_text())
    qc = {**BLOCK_CONFIG, "weight_block_size": [128, 64]}
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    with pytest.raises(InvalidArgument, match=r"weight_block_size \[128, 64\]") as err:
        loader.load_arch_config(str(tmp_path))
    assert err.value.field == "model"
