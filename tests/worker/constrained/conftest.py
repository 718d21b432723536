from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from radixmesh.tokenizer import Tokenizer
from radixmesh.worker.constrained.grammar import GrammarBackend
from radixmesh.worker.constrained.registry import create_grammar_backend
from radixmesh.worker.constrained.vocab import vocab_of
from radixmesh.worker.engine import Engine

VOCAB = 49152
EOS = 2  # <|im_end|>


@pytest.fixture(scope="session")
def tok(smollm2_gguf: Path) -> Tokenizer:
    from radixmesh.worker.model.loader import load_tokenizer

    t = load_tokenizer("smollm2")
    assert isinstance(t, Tokenizer)
    return t


@pytest.fixture(scope="session", params=["xgrammar", "outlines"])
def backend(request: pytest.FixtureRequest, tok: Tokenizer) -> GrammarBackend:
    vocab = vocab_of(tok, VOCAB, [EOS])
    assert vocab is not None
    return create_grammar_backend(request.param, vocab)


@pytest.fixture
def jump_forward(engine: Engine) -> Iterator[None]:
    """Restores the session engine's jump-forward switch after a test flips it."""
    before = engine.worker.grammars.jump_forward
    yield
    engine.worker.grammars.jump_forward = before
