"""Grammar backends by name, imported only when chosen (xgrammar and outlines-core are
optional heavy dependencies)."""

from __future__ import annotations

import importlib

from radixmesh.worker.constrained.grammar import GrammarBackend
from radixmesh.worker.constrained.vocab import Vocab

BACKENDS: dict[str, str] = {
    "xgrammar": "radixmesh.worker.constrained.xgrammar_backend:XGrammarBackend",
    "outlines": "radixmesh.worker.constrained.outlines_backend:OutlinesBackend",
}


def create_grammar_backend(name: str, vocab: Vocab) -> GrammarBackend:
    """Build backend `name` for one vocabulary. Raises ValueError for an unknown name and
    ImportError when its package is not installed."""
    if name not in BACKENDS:
        raise ValueError(f"unknown grammar backend {name!r}; expected one of {sorted(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    backend: GrammarBackend = getattr(importlib.import_module(module), cls)(vocab)
    return backend
