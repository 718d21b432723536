"""xgrammar over a padded byte vocabulary (the `dummy:` models): the compacted vocabulary
gives the same masks, accepts and forced text as the full one."""

from __future__ import annotations

import json

import pytest
import torch

from radixmesh.tokenizer import ByteTokenizer
from radixmesh.worker.constrained import xgrammar_backend
from radixmesh.worker.constrained.bitmask import allocate_bitmask
from radixmesh.worker.constrained.vocab import vocab_of
from radixmesh.worker.constrained.xgrammar_backend import XGrammarBackend, _CompactIds

VOCAB = 4096
EOS = (4001, 2)  # one stop id past the bytes, one among them
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _backend(compact: bool, monkeypatch: pytest.MonkeyPatch) -> XGrammarBackend:
    vocab = vocab_of(ByteTokenizer(VOCAB, eos_token_ids=EOS), VOCAB, list(EOS))
    assert vocab is not None
    with monkeypatch.context() as m:
        if not compact:
            m.setattr(xgrammar_backend._CompactIds, "of", classmethod(lambda *a: None))
        backend = XGrammarBackend(vocab)
    assert (backend._compact is not None) == compact
    return backend


def test_compact_ids_layout() -> None:
    table: list[bytes | None] = [bytes([i]) for i in range(256)] + [None] * (VOCAB - 256)
    c = _CompactIds.of(table, [4001, 2])
    assert c is not None
    assert c.kept == [*range(256), 4001]
    assert c.prefix_words == 8 and c.tail == [(256, 4001)]
    assert c.theirs(4001) == 256 and c.theirs(65) == 65 and c.theirs(300) is None
    assert _CompactIds.of(table[:400], [2]) is None  # little padding: not worth it


def test_same_masks_accepts_and_forced_text(monkeypatch: pytest.MonkeyPatch) -> None:
    full, compact = _backend(False, monkeypatch), _backend(True, monkeypatch)
    text = json.dumps(SCHEMA)
    mf = full.matcher(full.compile("json_schema", text))
    mc = compact.matcher(compact.compile("json_schema", text))
    out = b'{"name": "Bo", "age": 42}'
    steps = 0
    for k in range(len(out) + 1):
        a, b = allocate_bitmask(2, VOCAB), allocate_bitmask(2, VOCAB)
        mf.fill_bitmask(a, 1)
        mc.fill_bitmask(b, 1)
        assert torch.equal(a, b)
        batched = torch.zeros(1, a.shape[1], dtype=torch.int32)
        compact.fill_bitmasks([mc], batched)
        assert torch.equal(batched[0], a[1])
        assert mf.jump_forward_string() == mc.jump_forward_string()
        if k == len(out):
            assert int(a[1, 4001 // 32].item()) >> (4001 % 32) & 1  # complete: the stop id
            break
        assert mf.accept_token(out[k]) and mc.accept_token(out[k])
        assert not mc.accept_token(3000)  # a padding id is never accepted
        steps += 1
    assert steps == len(out)
    assert mc.accept_token(4001) and mc.is_terminated()
