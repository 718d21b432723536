"""The frontend language: SGLang's primitives over radixmesh backends.

A program written for `import sglang as sgl` runs with `import radixmesh as sgl`.
Backends load lazily (the OpenAI and Anthropic clients, torch for the engine)."""

from __future__ import annotations

from typing import Any

from radixmesh.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    image,
    select,
    separate_reasoning,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixmesh.lang.backend.registry import register_backend, set_default_backend
from radixmesh.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixmesh.lang.errors import BackendUnavailable, ProgramError
from radixmesh.lang.function import SglFunction, function
from radixmesh.lang.global_config import global_config
from radixmesh.lang.state import ProgramState, ProgramStateGroup

_LAZY = {
    "OpenAI": "radixmesh.lang.backend.openai",
    "Anthropic": "radixmesh.lang.backend.anthropic",
    "RuntimeEndpoint": "radixmesh.lang.backend.runtime",
    "Runtime": "radixmesh.lang.backend.local_runtime",
    "EngineBackend": "radixmesh.lang.backend.engine",
    "Crusoe": "radixmesh.lang.backend.crusoe",
    "LiteLLM": "radixmesh.lang.backend.litellm",
    "VertexAI": "radixmesh.lang.backend.vertexai",
}

__all__ = [
    "Anthropic",
    "BackendUnavailable",
    "Crusoe",
    "EngineBackend",
    "LiteLLM",
    "OpenAI",
    "ProgramError",
    "ProgramState",
    "ProgramStateGroup",
    "Runtime",
    "RuntimeEndpoint",
    "SglFunction",
    "VertexAI",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_server_info",
    "global_config",
    "greedy_token_selection",
    "image",
    "register_backend",
    "select",
    "separate_reasoning",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'radixmesh.lang' has no attribute {name!r}")
