"""Model specs resolved once for worker and router; the router's tokenizer without worker code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from radixmesh import model_source
from radixmesh.errors import InvalidArgument
from radixmesh.tokenizer import ByteTokenizer, Tokenizer, tokenizer_for
from radixmesh.worker.model.loader import load_tokenizer

TEXT = "Routers tokenize once; workers trust the ids."


def test_resolve_model_kinds(tmp_path: Path) -> None:
    assert model_source.resolve_model("dummy:tiny") == model_source.ModelSource(
        "dummy", preset="tiny"
    )
    (tmp_path / "config.json").write_text("{}")
    assert model_source.resolve_model(str(tmp_path)) == model_source.ModelSource(
        "hf", path=str(tmp_path.resolve())
    )
    with pytest.raises(InvalidArgument) as e:
        model_source.resolve_model("nope", presets=["tiny", "llama-3-8b"])
    assert e.value.field == "model"
    assert "(presets: llama-3-8b, tiny)" in str(e.value)


def test_tokenizer_for_dummy_is_the_workers() -> None:
    tok = tokenizer_for("dummy:tiny", vocab_size=512, eos_token_ids=[2], bos_token_id=1)
    worker = load_tokenizer("dummy:tiny")
    assert isinstance(tok, ByteTokenizer) and isinstance(worker, ByteTokenizer)
    assert (tok.vocab_size, tok.eos_token_ids, tok.bos_token_id) == (512, frozenset({2}), 1)
    assert (worker.vocab_size, worker.eos_token_ids, worker.bos_token_id) == (
        512,
        frozenset({2}),
        1,
    )
    assert tok.encode(TEXT) == worker.encode(TEXT)


@pytest.mark.slow
def test_tokenizer_for_smollm2_is_the_workers() -> None:
    tok = tokenizer_for("smollm2", vocab_size=49152, eos_token_ids=[2], bos_token_id=1)
    worker = load_tokenizer("smollm2")
    assert isinstance(tok, Tokenizer) and isinstance(worker, Tokenizer)
    assert tok.encode(TEXT) == worker.encode(TEXT)
    messages = [{"role": "user", "content": TEXT}]
    assert tok.encode_chat(messages) == worker.encode_chat(messages)
    assert tok.eos_token_ids == worker.eos_token_ids == frozenset({2})


def test_the_router_imports_no_worker_code() -> None:
    """The router's modules and its tokenizer load without `radixmesh.worker` (design rule:
    the router never imports worker internals)."""
    code = (
        "import sys\n"
        "import radixmesh.router.server, radixmesh.router.service, radixmesh.router.pool\n"
        "from radixmesh.tokenizer import tokenizer_for\n"
        "tok = tokenizer_for('dummy:tiny', vocab_size=512, eos_token_ids=[2], bos_token_id=1)\n"
        "assert tok.encode('ab') == [97, 98]\n"
        "print(sorted(m for m in sys.modules if m.startswith('radixmesh.worker')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
