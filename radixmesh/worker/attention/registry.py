"""Attention backends by name, imported only when chosen (GPU kernels need GPU packages).

Built-ins are listed as "module:Class" paths; other code may add factories with
`register_attention_backend` (e.g. a test double). Which name a worker builds, and what
happens when FlashInfer cannot run, is selection.py's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from radixmesh.worker.attention.base import AttentionBackend
from radixmesh.worker.kvcache.pool import KVPool

BackendFactory = Callable[[KVPool, float], AttentionBackend]

_BUILTIN: dict[str, str] = {
    "torch": "radixmesh.worker.attention.torch_backend:TorchAttentionBackend",
    "triton": "radixmesh.worker.attention.triton_backend:TritonAttentionBackend",
    "flashinfer": "radixmesh.worker.attention.flashinfer_backend:FlashInferAttentionBackend",
}
_REGISTERED: dict[str, BackendFactory] = {}


def available_attention_backends() -> list[str]:
    return sorted({*_BUILTIN, *_REGISTERED})


def register_attention_backend(name: str, factory: BackendFactory) -> None:
    if name in _BUILTIN or name in _REGISTERED:
        raise ValueError(f"attention backend {name!r} is already registered")
    _REGISTERED[name] = factory


def create_attention_backend(name: str, kv_pool: KVPool, scale: float) -> AttentionBackend:
    """A new backend over `kv_pool`; `scale` multiplies q.k (usually 1 / sqrt(head_dim))."""
    if name in _REGISTERED:
        return _REGISTERED[name](kv_pool, scale)
    if name not in _BUILTIN:
        raise ValueError(
            f"attention_backend: unknown {name!r}; choices: {available_attention_backends()}"
        )
    module_name, class_name = _BUILTIN[name].split(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    backend: AttentionBackend = backend_class(kv_pool, scale)
    return backend
