"""xgrammar: JSON schema, regex and EBNF compiled into a pushdown automaton with
precomputed token masks (the default backend).

JSON schemas compile with `any_whitespace=False`: the output has one fixed layout
(`{"key": value, ...}`), so the keys and separators between values are forced strings
that jump-forward appends without decode steps. With free whitespace nothing but `{`
would be forced.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
import xgrammar as xgr

from radixmesh.worker.constrained.grammar import (
    GrammarBackend,
    GrammarError,
    Matcher,
    choices_regex,
)
from radixmesh.worker.constrained.vocab import Vocab

# xgrammar prefixes messages with "[hh:mm:ss] /path/file.cc:123: "; the rest is the reason.
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class XGrammarMatcher(Matcher):
    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self._m = xgr.GrammarMatcher(compiled)

    def accept_token(self, token: int) -> bool:
        return bool(self._m.accept_token(token))

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def jump_forward_string(self) -> str:
        return str(self._m.find_jump_forward_string())

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(self, vocab: Vocab) -> None:
        if vocab.hf_tokenizer is not None:
            info = xgr.TokenizerInfo.from_huggingface(
                vocab.hf_tokenizer, vocab_size=vocab.vocab_size, stop_token_ids=vocab.stop_token_ids
            )
        else:  # raw bytes; empty entries are special tokens to xgrammar
            info = xgr.TokenizerInfo(
                [b or b"" for b in vocab.token_bytes],
                xgr.VocabType.RAW,
                vocab_size=vocab.vocab_size,
                stop_token_ids=vocab.stop_token_ids,
            )
        # Our own cache (compile_cache.py) keeps compiled grammars; one compile thread
        # per call is enough on the worker's pool.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        # Fills the rows of a step on a thread pool (half the cores).
        self._batch = xgr.BatchGrammarMatcher(max_threads="auto")

    def compile(self, kind: str, text: str) -> Any:
        try:
            if kind == "json_schema":
                grammar = xgr.Grammar.from_json_schema(text, any_whitespace=False)
                return self._compiler.compile_grammar(_json_safe(str(grammar)))
            if kind == "regex":
                return self._compiler.compile_regex(text)
            if kind == "ebnf":
                return self._compiler.compile_grammar(text)
            if kind == "choices":
                return self._compiler.compile_regex(choices_regex(text.split("\x00")))
        except (RuntimeError, ValueError) as e:
            raise GrammarError(_clean(str(e))) from e
        raise GrammarError(f"unknown constraint kind {kind!r}")

    def matcher(self, compiled: Any) -> Matcher:
        return XGrammarMatcher(compiled)

    def fill_bitmasks(self, matchers: Sequence[Matcher], bitmask: torch.Tensor) -> None:
        inner = []
        for m in matchers:
            assert isinstance(m, XGrammarMatcher), type(m)
            inner.append(m._m)
        self._batch.batch_fill_next_token_bitmask(inner, bitmask)


# xgrammar 0.2.9 writes the characters of a length-bounded JSON string (minLength /
# maxLength) as `[^"\\\r\n]`, which admits raw control characters (invalid JSON: a random
# model emits them). Its unbounded strings use the right class; use it for both.
_BOUNDED_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\]"


def _json_safe(ebnf: str) -> str:
    return ebnf.replace(_BOUNDED_STRING_CHAR, _JSON_STRING_CHAR)


def _clean(message: str) -> str:
    return _LOG_PREFIX.sub("", message.strip())
