"""Both backends on the bundled model's tokenizer: masks, accept, rollback, forced text."""

from __future__ import annotations

import json

import pytest
import torch

from radixmesh.tokenizer import Tokenizer
from radixmesh.worker.constrained.bitmask import allocate_bitmask, unpack_bitmask
from radixmesh.worker.constrained.grammar import GrammarBackend, GrammarError, choices_regex
from radixmesh.worker.constrained.registry import create_grammar_backend
from radixmesh.worker.constrained.vocab import Vocab, vocab_of
from tests.worker.constrained.conftest import EOS, VOCAB


def allowed(backend: GrammarBackend, matcher: object) -> set[int]:
    bits = allocate_bitmask(1, VOCAB)
    matcher.fill_bitmask(bits, 0)  # type: ignore[attr-defined]
    return set(torch.nonzero(unpack_bitmask(bits, VOCAB)[0]).view(-1).tolist())


def test_regex_mask_accept_rollback_terminate(backend: GrammarBackend, tok: Tokenizer) -> None:
    m = backend.matcher(backend.compile("regex", "[0-9]{2}"))
    first = allowed(backend, m)
    assert first and all(tok.decode([t]).isdigit() for t in first)
    assert EOS not in first
    two = tok.encode("42")
    for t in two:
        assert m.accept_token(t)
    assert allowed(backend, m) == {EOS}  # complete: only the stop token
    assert not m.accept_token(tok.encode("7")[0])
    m.rollback(len(two))
    assert allowed(backend, m) == first
    for t in two:
        assert m.accept_token(t)
    assert not m.is_terminated()
    assert m.accept_token(EOS)
    assert m.is_terminated()


def test_batched_fill_equals_row_by_row(backend: GrammarBackend, tok: Tokenizer) -> None:
    compiled = backend.compile("regex", "(ab|[0-9]{2,3})-x")
    matchers = [backend.matcher(compiled) for _ in range(5)]
    for m, text in zip(matchers, ["", "4", "42", "ab", "ab-"], strict=True):
        for t in tok.encode(text):
            assert m.accept_token(t)
    one_by_one = allocate_bitmask(5, VOCAB)
    for j, m in enumerate(matchers):
        m.fill_bitmask(one_by_one, j)
    batched = torch.zeros_like(one_by_one)
    backend.fill_bitmasks(matchers, batched)
    assert torch.equal(batched, one_by_one)
    rows = unpack_bitmask(batched, VOCAB)
    assert set(torch.nonzero(rows[4]).view(-1).tolist()) == {tok.encode("x")[0]}
    assert len(set(map(tuple, rows.tolist()))) == 5  # five states, five different masks


def test_forced_string_of_a_literal_prefix(backend: GrammarBackend) -> None:
    m = backend.matcher(backend.compile("regex", "hello_world_[0-9]"))
    forced = m.jump_forward_string()
    assert forced and "hello_world_".startswith(forced)


def test_xgrammar_forces_whole_json_keys(tok: Tokenizer) -> None:
    xg = create_grammar_backend("xgrammar", vocab_of(tok, VOCAB, [EOS]))  # type: ignore[arg-type]
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    m = xg.matcher(xg.compile("json_schema", json.dumps(schema)))
    assert m.jump_forward_string() == '{"name": "'


def test_choices(backend: GrammarBackend, tok: Tokenizer) -> None:
    m = backend.matcher(backend.compile("choices", "\x00".join(["a.b", "c|d (e)"])))
    for t in tok.encode("c|d (e)"):
        assert m.accept_token(t)
    assert allowed(backend, m) == {EOS}


def test_choices_regex_escapes_metacharacters() -> None:
    assert choices_regex(["a.b", "x+"]) == r"(a\.b|x\+)"


def test_bad_regex_raises_grammar_error(backend: GrammarBackend) -> None:
    with pytest.raises(GrammarError):
        backend.compile("regex", "[0-9")


def test_outlines_has_no_ebnf_or_structural_tag(tok: Tokenizer) -> None:
    oc = create_grammar_backend("outlines", vocab_of(tok, VOCAB, [EOS]))  # type: ignore[arg-type]
    with pytest.raises(GrammarError, match="does not support ebnf"):
        oc.compile("ebnf", 'root ::= "a"')
    with pytest.raises(GrammarError, match="does not support structural_tag"):
        oc.compile("structural_tag", "{}")


def test_xgrammar_structural_tag(tok: Tokenizer) -> None:
    """Fixed text around a JSON-schema part (a tool call), forced where it is fixed."""
    xg = create_grammar_backend("xgrammar", vocab_of(tok, VOCAB, [EOS]))  # type: ignore[arg-type]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    content = {"type": "json_schema", "json_schema": schema}
    fmt = {"type": "tag", "begin": "<call>", "content": content, "end": "</call>"}
    m = xg.matcher(
        xg.compile("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}))
    )
    assert m.jump_forward_string().startswith("<call>")
    for t in tok.encode('<call>{"n": 7}</call>'):
        assert m.accept_token(t)
    assert allowed(xg, m) == {EOS}
    with pytest.raises(GrammarError, match="Format type not recognized"):
        xg.compile(
            "structural_tag", json.dumps({"type": "structural_tag", "format": {"type": "x"}})
        )


def test_unknown_backend_name() -> None:
    with pytest.raises(ValueError, match="unknown grammar backend 'lark'"):
        create_grammar_backend("lark", Vocab([None] * VOCAB, [EOS]))


@pytest.mark.parametrize("name", ["xgrammar", "outlines"])
def test_byte_tokenizer_vocab(name: str) -> None:
    """dummy: models (ids 0..255 = bytes): grammars work on them too."""
    from radixmesh.tokenizer import ByteTokenizer

    vocab = vocab_of(ByteTokenizer(300, eos_token_ids=[299]), 300, [299])
    assert vocab is not None and vocab.token_bytes[97] == b"a" and vocab.token_bytes[256] is None
    backend = create_grammar_backend(name, vocab)
    m = backend.matcher(backend.compile("regex", "ab[0-9]"))
    assert m.jump_forward_string().startswith("a")
    bits = allocate_bitmask(1, 300)
    m.fill_bitmask(bits, 0)
    assert torch.nonzero(unpack_bitmask(bits, 300)[0]).view(-1).tolist() == [97]


@pytest.mark.parametrize("name", ["xgrammar", "outlines"])
def test_bounded_json_strings_refuse_control_characters(name: str) -> None:
    """xgrammar 0.2.9 admits raw control bytes in minLength/maxLength strings; ours not."""
    from radixmesh.tokenizer import ByteTokenizer

    vocab = vocab_of(ByteTokenizer(300, eos_token_ids=[299]), 300, [299])
    assert vocab is not None
    backend = create_grammar_backend(name, vocab)
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 8}}}
    schema["required"] = ["a"]
    m = backend.matcher(backend.compile("json_schema", json.dumps(schema)))
    sep = b": " if name == "xgrammar" else b":"  # outlines compiles with no whitespace
    for t in b'{"a"' + sep + b'"k':
        assert m.accept_token(t)
    bits = allocate_bitmask(1, 300)
    m.fill_bitmask(bits, 0)
    ok = torch.nonzero(unpack_bitmask(bits, 300)[0]).view(-1).tolist()
    assert [t for t in ok if t < 0x20] == []
    assert ord("z") in ok and ord('"') in ok
