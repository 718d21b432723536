"""Loading Hugging Face checkpoints stored in FP8 (`quantization_config`, quant_method
"fp8"): values and scales land unchanged, the logits are those of the dequantized model
in transformers, and the engine serves such a checkpoint without being told."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from radixmesh import model_source
from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from radixmesh.worker.layers.quantization.fp8 import FP8, dequantize_rows, quantize_rows
from radixmesh.worker.model import loader
from radixmesh.worker.model.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from tests.worker.model.helpers import RaggedRunner, hf_logits, make_pair, random_ids

FP8_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic"}
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def quantize_checkpoint(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An FP8 checkpoint as FP8 tools write one: attention projections with one scale per
    tensor ([]), MLP projections one per output channel ([out, 1]); layer 1's down_proj
    left in full precision (an "ignored layer"); a static input_scale and a k_scale that
    the engine does not use."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        proj = name.split(".")[-2] if name.endswith(".weight") else ""
        if proj in ATTENTION:
            scale = t.abs().amax() / 448
            out[name] = (t / scale).to(FP8)
            out[name.replace(".weight", ".weight_scale")] = scale.reshape(())
        elif proj in MLP and "layers.1.mlp.down_proj" not in name:
            q, scale = quantize_rows(t)
            out[name] = q
            out[name.replace(".weight", ".weight_scale")] = scale[:, None]
        else:
            out[name] = t.contiguous()
    out["model.layers.0.self_attn.q_proj.input_scale"] = torch.tensor(0.1)
    out["model.layers.0.self_attn.k_scale"] = torch.tensor(1.0)
    return out


def dequantized(ckpt: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The full-precision weights the engine serves an FP8 checkpoint as: FP8 values times
    their scales, and the full-precision projection as quantized at load."""
    out = {}
    for name, t in ckpt.items():
        if t.dtype == FP8:
            scale = ckpt[name.replace(".weight", ".weight_scale")].reshape(-1)
            out[name] = dequantize_rows(t, scale.expand(t.shape[0]), torch.float32)
        elif name.endswith(".weight") and name.split(".")[-2] in MLP:
            out[name] = dequantize_rows(*quantize_rows(t), torch.float32)
        elif name.endswith(".weight"):
            out[name] = t
    return out


def write_checkpoint(path: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def tiny_fp8(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Any]:
    hf, _ = make_pair("llama")
    ckpt = quantize_checkpoint(dict(hf.state_dict()))
    path = tmp_path_factory.mktemp("fp8-ckpt")
    write_checkpoint(path, {**hf.config.to_dict(), "quantization_config": FP8_CONFIG}, ckpt)
    hf.load_state_dict(dequantized(ckpt))  # transformers holding the same numbers
    return path, ckpt, hf


@pytest.mark.parametrize("sliced", [False, True], ids=["tensors", "lazy-slices"])
def test_fp8_checkpoint_loads_its_values_and_scales_unchanged(
    tiny_fp8: tuple[Path, dict[str, Any], Any], sliced: bool
) -> None:
    path, ckpt, _ = tiny_fp8
    assert loader.load_quantization(str(path)) == "fp8-channel"
    arch = loader.load_arch_config(str(path))
    model = LlamaForCausalLM(arch, quantization="fp8-channel")
    model.load_weights(loader.iter_weights(str(path), arch, dtype=torch.float32, sliced=sliced))
    first, second = model.model.layers[0], model.model.layers[1]
    assert isinstance(first, LlamaDecoderLayer) and isinstance(second, LlamaDecoderLayer)
    assert isinstance(first.mlp, LlamaMLP) and isinstance(second.mlp, LlamaMLP)
    attn = first.self_attn.qkv_proj
    stored = torch.cat([ckpt[f"model.layers.0.self_attn.{p}.weight"] for p in ATTENTION[:3]])
    assert torch.equal(attn.weight.view(torch.uint8), stored.view(torch.uint8))
    per_tensor = [ckpt[f"model.layers.0.self_attn.{p}.weight_scale"] for p in ATTENTION[:3]]
    rows = [64, 32, 32]  # q, k, v rows of the small test model
    expected = torch.cat([s.expand(n) for s, n in zip(per_tensor, rows, strict=True)])
    assert torch.equal(attn.weight_scale, expected)
    mlp = first.mlp.down_proj
    assert torch.equal(mlp.weight_scale, ckpt["model.layers.0.mlp.down_proj.weight_scale"][:, 0])
    # The full-precision layer of the checkpoint is quantized at load like any other.
    ignored = second.mlp.down_proj
    q, scale = quantize_rows(ckpt["model.layers.1.mlp.down_proj.weight"])
    assert torch.equal(ignored.weight.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(ignored.weight_scale, scale)


def test_fp8_checkpoint_logits_equal_the_dequantized_model(
    tiny_fp8: tuple[Path, dict[str, Any], Any],
) -> None:
    path, _, hf = tiny_fp8
    arch = loader.load_arch_config(str(path))
    model = LlamaForCausalLM(arch, quantization=loader.load_quantization(str(path)))
    model.load_weights(loader.iter_weights(str(path), arch, dtype=torch.float32))
    ids = random_ids(40, seed=3)
    ours = RaggedRunner(model).step([(0, ids)])[0]
    torch.testing.assert_close(ours, hf_logits(hf, ids), rtol=1e-4, atol=1e-4)


def test_an_fp8_weight_without_its_scale_names_the_layer(
    tiny_fp8: tuple[Path, dict[str, Any], Any],
) -> None:
    path, ckpt, _ = tiny_fp8
    arch = loader.load_arch_config(str(path))
    model = LlamaForCausalLM(arch, quantization="fp8-channel")
    skipped = "model.layers.1.self_attn.k_proj.weight_scale"
    weights = [(n, t) for n, t in ckpt.items() if n != skipped and "input_scale" not in n]
    weights = [(n, t) for n, t in weights if not n.endswith("k_scale")]
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.qkv_proj: .*weight_scale"):
        model.load_weights(weights)


@pytest.mark.parametrize(
    ("qc", "message"),
    [
        ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq' is not supported"),
        ({**FP8_CONFIG, "weight_block_size": [64, 64]}, r"weight_block_size \[64, 64\]"),
    ],
)
def test_other_quantized_checkpoints_name_the_model_field(
    tiny_fp8: tuple[Path, dict[str, Any], Any], tmp_path: Path, qc: dict[str, Any], message: str
) -> None:
    src, _, _ = tiny_fp8
    config = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    with pytest.raises(InvalidArgument, match=message) as err:
        loader.load_arch_config(str(tmp_path))
    assert err.value.field == "model"


def test_engine_serves_an_fp8_smollm2_checkpoint_unprompted(
    smollm2_gguf: Path, tmp_path: Path
) -> None:
    """SmolLM2 written as an FP8 checkpoint (with its tokenizer) is served as FP8 without a
    quantization option, and still knows the capital of France."""
    source = Path(model_source.cached_dir(str(smollm2_gguf)) or "")
    arch = loader.load_arch_config("smollm2")
    weights = dict(loader.iter_weights("smollm2", arch, dtype=torch.bfloat16))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(source / name, tmp_path / name)
    config = {**arch.to_hf_dict(), "quantization_config": FP8_CONFIG}
    write_checkpoint(tmp_path, config, quantize_checkpoint(weights))
    engine = Engine(str(tmp_path), dtype="float32", kv_cache_tokens=512, max_running_requests=2)
    try:
        assert engine.worker.quantization == "fp8-channel"
        out = engine.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 3})
        assert isinstance(out, dict) and out["text"].startswith(" Paris")
    finally:
        engine.shutdown()
