"""Hugging Face model directories: config.json, *.safetensors (sharded or not), tokenizer.

Weights are read lazily with `safetensors.safe_open`, one tensor at a time, so loading
never holds more than one tensor beyond what the model itself keeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from radixmesh.errors import InvalidArgument
from radixmesh.worker.layers.quantization.fp8_static import check_input_scale
from radixmesh.worker.layers.weights import LazySlice, Loaded
from radixmesh.worker.model.arch import LlamaArchConfig

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Phi3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "GraniteForCausalLM",
    "SmolLM3ForCausalLM",
)
INDEX_FILE = "model.safetensors.index.json"
FP8 = torch.float8_e4m3fn
_SAFETENSORS_FP8 = "F8_E4M3"
_SCALE = ".weight_scale"
# Block-scaled FP8 checkpoints name their scales so (they multiply, despite the name).
_SCALE_INV = ".weight_scale_inv"
# Static activation scales: loaded where activation_scheme is "static", else read past.
_INPUT_SCALE = ".input_scale"
_UNUSED_SCALES = (".output_scale", ".k_scale", ".v_scale", ".kv_scale")


def read_arch_config(model_dir: str | Path) -> LlamaArchConfig:
    """config.json (plus generation_config.json's eos ids) as a LlamaArchConfig."""
    model_dir = Path(model_dir)
    cfg = _read_json(model_dir / "config.json")
    check_supported(cfg, model_dir)
    arch = LlamaArchConfig.from_hf_dict(cfg)
    # Chat models often list extra stop ids (Llama 3's <|eot_id|>) only in the generation
    # config; without them generation would run past the end of a turn.
    gen_path = model_dir / "generation_config.json"
    gen_eos = _as_ids(_read_json(gen_path).get("eos_token_id")) if gen_path.is_file() else ()
    extra = tuple(i for i in gen_eos if i not in arch.eos_token_ids)
    return arch.replace(eos_token_ids=arch.eos_token_ids + extra) if extra else arch


def check_supported(cfg: dict[str, Any], where: str | Path) -> None:
    archs = cfg.get("architectures") or ["LlamaForCausalLM"]
    if archs[0] not in SUPPORTED_ARCHITECTURES:
        raise InvalidArgument(
            "model",
            f"{where}: architecture {archs[0]} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}",
        )
    rope = cfg.get("rope_parameters")
    rope = rope if isinstance(rope, dict) else {}
    partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):  # Phi-4-mini's 0.75
        raise InvalidArgument(
            "model", f"{where}: partial rotary (partial_rotary_factor {partial}) is not supported"
        )
    quantized = checkpoint_quantization(cfg, where)
    if quantized and archs[0] == "Phi3ForCausalLM":
        # Its q/k/v and gate/up come fused in one tensor each, split at load (llama.py);
        # their scales would need the same split.
        raise InvalidArgument("model", f"{where}: quantized Phi-3 checkpoints are not supported")
    if cfg.get("mlp_bias"):
        raise InvalidArgument("model", f"{where}: mlp_bias is not supported")


def checkpoint_quantization(cfg: dict[str, Any], where: str | Path) -> str | None:
    """The quantization a checkpoint's weights are stored in: None, "fp8-channel" (a
    weight_scale per tensor or per output channel), "fp8-static" (the same, with
    activation_scheme "static": an input_scale per linear layer, used as its activations'
    scale, layers/quantization/fp8_static.py) or "fp8-128x128" / "fp8-1x128"
    (`weight_block_size` [128, 128] or [1, 128]: `weight_scale_inv` per block).

    With activation_scheme "dynamic" (or none) input_scale tensors are read past and
    activations are quantized per token. KV scales are never used: the FP8 KV cache keeps
    its own. Rejected: static scales beside block scales (the block-scaled layers have no
    use for them), and other block sizes (every kernel reads scales per 128 input
    columns)."""
    qc = cfg.get("quantization_config")
    if not qc:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method != "fp8":
        raise InvalidArgument(
            "model",
            f"{where}: quantization_config quant_method {method!r} is not supported "
            "(supported: 'fp8')",
        )
    block = qc.get("weight_block_size")
    if block and static_activation_scales(cfg):
        raise InvalidArgument(
            "model",
            f"{where}: FP8 activation_scheme 'static' with weight_block_size is not supported",
        )
    if not block:
        return "fp8-static" if static_activation_scales(cfg) else "fp8-channel"
    if list(block) not in ([128, 128], [1, 128]):
        raise InvalidArgument(
            "model",
            f"{where}: FP8 weight_block_size {block} is not supported "
            "(supported: [128, 128], [1, 128])",
        )
    return f"fp8-{block[0]}x{block[1]}"


def static_activation_scales(cfg: dict[str, Any]) -> bool:
    """Whether an FP8 checkpoint's config says its input_scale tensors are to be used."""
    qc = cfg.get("quantization_config")
    return (
        isinstance(qc, dict)
        and qc.get("quant_method") == "fp8"
        and qc.get("activation_scheme") == "static"
    )


def read_quantization(model_dir: str | Path) -> str | None:
    return checkpoint_quantization(_read_json(Path(model_dir) / "config.json"), model_dir)


def weight_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a directory: the index's shards, or every *.safetensors."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        shards = sorted(set(_read_json(index)["weight_map"].values()))
        return [model_dir / s for s in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise InvalidArgument(
            "model", f"{model_dir} has no *.safetensors weights (only safetensors are supported)"
        )
    return files


def iter_hf_weights(
    model_dir: str | Path,
    arch: LlamaArchConfig,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    sliced: bool = False,
) -> Iterator[tuple[str, Loaded]]:
    """(HF name, tensor) for every parameter, cast to `dtype` on `device`; FP8 weights
    and their float32 scales keep their own dtypes.

    sliced=True (tensor parallelism): `LazySlice`s instead, so each rank reads only the
    rows or columns its layers keep; valid until the next item is requested.

    Static activation scales (`static_activation_scales`): every input_scale is checked
    as it comes and every FP8 weight must have one; either fault is an InvalidArgument
    naming the tensor (the last one raised once every file was read)."""
    static = static_activation_scales(_read_json(Path(model_dir) / "config.json"))
    fp8_weights: list[str] = []
    input_scales: set[str] = set()
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 -- safe_open handles are not iterable
                if _skip(name, arch, static):
                    continue
                if name.endswith(_INPUT_SCALE):
                    input_scales.add(name)
                    yield name, _input_scale(model_dir, name, f.get_tensor(name), device)
                elif name.endswith(_SCALE_INV):  # the same role: the layer's weight_scale
                    scale = f.get_tensor(name).to(device=device, dtype=torch.float32)
                    yield name.removesuffix("_inv"), scale
                elif name.endswith(_SCALE):  # tiny, and never narrowed to a model dtype
                    yield name, f.get_tensor(name).to(device=device, dtype=torch.float32)
                elif sliced:
                    part = f.get_slice(name)
                    fp8 = part.get_dtype() == _SAFETENSORS_FP8
                    fp8_weights += [name] if fp8 else []
                    load_dtype = FP8 if fp8 else dtype
                    yield name, LazySlice(part, dtype=load_dtype, device=device)
                else:
                    tensor = f.get_tensor(name)
                    fp8_weights += [name] if tensor.dtype == FP8 else []
                    load_dtype = FP8 if tensor.dtype == FP8 else dtype
                    yield name, tensor.to(device=device, dtype=load_dtype)
    if static:
        _check_input_scales_present(model_dir, fp8_weights, input_scales)


def _skip(name: str, arch: LlamaArchConfig, static: bool) -> bool:
    # Old checkpoints store rotary inverse frequencies (recomputed by the model), and some
    # store lm_head even when it is tied to the embedding. FP8 checkpoints may carry KV
    # scales, which this engine does not use, and activation scales, used only where the
    # checkpoint says they are static (see checkpoint_quantization).
    if name.endswith(("rotary_emb.inv_freq", *_UNUSED_SCALES)):
        return True
    if name.endswith(_INPUT_SCALE):
        return not static
    return arch.tie_word_embeddings and name == "lm_head.weight"


def _input_scale(
    model_dir: str | Path, name: str, tensor: torch.Tensor, device: torch.device | str
) -> torch.Tensor:
    """A static input_scale as float32 [] on `device`, or an InvalidArgument naming it."""
    try:
        return check_input_scale(tensor).to(device)
    except ValueError as e:
        raise InvalidArgument("model", f"{model_dir}: {name}: {e}") from None


def _check_input_scales_present(
    model_dir: str | Path, fp8_weights: list[str], input_scales: set[str]
) -> None:
    """Every FP8 weight of a static checkpoint has its input_scale (layers the checkpoint
    keeps in full precision need none: they are quantized at load, per token)."""
    wanted = [w.removesuffix(".weight") + _INPUT_SCALE for w in fp8_weights]
    missing = [name for name in wanted if name not in input_scales]
    if missing:
        shown = ", ".join(missing[:4]) + (
            f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        )
        raise InvalidArgument(
            "model",
            f"{model_dir}: activation_scheme is 'static' but {shown} "
            + ("is missing" if len(missing) == 1 else "are missing"),
        )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidArgument("model", f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise InvalidArgument("model", f"{path} is not a JSON object")
    return data


def _as_ids(value: object) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return ()
