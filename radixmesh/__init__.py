"""radixmesh: serving for structured LLM programs.

The public API is re-exported here; heavy modules (torch, transformers) load on first use
so `import radixmesh` stays cheap for clients that only speak gRPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixmesh import lang as _lang
from radixmesh.errors import InvalidArgument, RadixMeshError
from radixmesh.sampling_params import SamplingParams
from radixmesh.version import __version__

if TYPE_CHECKING:
    from radixmesh.worker.engine import Engine

__all__ = [
    "Engine",
    "InvalidArgument",
    "RadixMeshError",
    "SamplingParams",
    "ServerArgs",
    "__version__",
    *_lang.__all__,
]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from radixmesh.worker.engine import Engine

        return Engine
    if name == "ServerArgs":  # SGLang's name for the engine's configuration
        from radixmesh.worker.config import EngineConfig

        return EngineConfig
    if name in _lang.__all__:  # the frontend language (SGLang's API), see radixmesh.lang
        return getattr(_lang, name)
    raise AttributeError(f"module 'radixmesh' has no attribute {name!r}")
