"""Grammar backends by name, imported only when chosen (xgrammar and outlines-core are
optional heavy dependencies)."""

from __future__ import annotations

import importlib
from typing import Any

from radixmesh.worker.constrained.grammar import GrammarBackend

BACKENDS: dict[str, str] = {
    "xgrammar": "radixmesh.worker.constrained.xgrammar_backend:XGrammarBackend",
    "outlines": "radixmesh.worker.constrained.outlines_backend:OutlinesBackend",
}


def create_grammar_backend(
    name: str, hf_tokenizer: Any, vocab_size: int, stop_token_ids: list[int]
) -> GrammarBackend:
    """Build backend `name` for one tokenizer. Raises ValueError for an unknown name and
    ImportError when its package is not installed."""
    if name not in BACKENDS:
        raise ValueError(f"unknown grammar backend {name!r}; expected one of {sorted(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    backend: GrammarBackend = getattr(importlib.import_module(module), cls)(
        hf_tokenizer, vocab_size, stop_token_ids
    )
    return backend
