"""Backends by name, imported lazily, and the process-wide default backend.

The default lives in `global_config.default_backend` (SGLang's place for it).
`set_default_backend` accepts a backend object, a `radixmesh.Engine` (wrapped in the
in-process backend), a `Runtime` (its `.endpoint`) or a registered name; anything else
is rejected with the names that exist.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from radixmesh.lang.backend.base import Backend
from radixmesh.lang.global_config import global_config

# name -> "module:attribute" of a factory taking keyword options
_REGISTRY: dict[str, str] = {
    "engine": "radixmesh.lang.backend.engine:EngineBackend",
    "openai": "radixmesh.lang.backend.openai:OpenAI",
    "anthropic": "radixmesh.lang.backend.anthropic:Anthropic",
    "runtime": "radixmesh.lang.backend.runtime:RuntimeEndpoint",
}
# The wrapper of an Engine lives on the engine itself: a WeakKeyDictionary would keep
# the engine alive forever, because its value (the wrapper) refers to its key.
_WRAPPER_ATTR = "_lang_backend"
_lock = threading.Lock()


def register_backend(name: str, target: str) -> None:
    """Register `target` ("module:attribute") under `name`."""
    _REGISTRY[name] = target


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


def create_backend(name: str, **options: Any) -> Backend:
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(backend_names())}")
    module, attr = _REGISTRY[name].split(":")
    backend = getattr(importlib.import_module(module), attr)(**options)
    assert isinstance(backend, Backend)
    return backend


def as_backend(obj: object) -> Backend:
    """A backend object from what the user passed (backend, Engine or registered name)."""
    if isinstance(obj, Backend):
        return obj
    if isinstance(obj, str):
        return create_backend(obj)
    if isinstance(getattr(obj, "endpoint", None), Backend):  # a Runtime, as in SGLang
        endpoint: Backend = obj.endpoint  # type: ignore[attr-defined]
        return endpoint
    if type(obj).__module__ == "radixmesh.worker.engine" and type(obj).__name__ == "Engine":
        with _lock:
            wrapper = getattr(obj, _WRAPPER_ATTR, None)
            if wrapper is None:
                from radixmesh.lang.backend.engine import EngineBackend

                wrapper = EngineBackend(obj)  # type: ignore[arg-type]
                setattr(obj, _WRAPPER_ATTR, wrapper)
            assert isinstance(wrapper, Backend)
            return wrapper
    raise ValueError(
        f"unknown backend {obj!r}: expected a radixmesh.Engine, a backend object "
        f"(OpenAI, Anthropic, ...) or one of the names {', '.join(backend_names())}"
    )


def set_default_backend(backend: object) -> None:
    global_config.default_backend = as_backend(backend)


def get_default_backend() -> Backend | None:
    default = global_config.default_backend
    return None if default is None else as_backend(default)


def resolve_backend(backend: object | None) -> Backend:
    if backend is not None:
        return as_backend(backend)
    default = get_default_backend()
    if default is None:
        raise ValueError(
            "backend: no backend given and no default set; call "
            "radixmesh.set_default_backend(radixmesh.Engine(...)) or pass backend="
        )
    return default
