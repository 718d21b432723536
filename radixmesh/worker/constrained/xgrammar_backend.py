"""xgrammar: JSON schema, regex, EBNF and structural tags compiled into a pushdown
automaton with precomputed token masks (the default backend).

JSON schemas compile with `any_whitespace=False`: the output has one fixed layout
(`{"key": value, ...}`), so the keys and separators between values are forced strings
that jump-forward appends without decode steps. With free whitespace nothing but `{`
would be forced.

Raw byte vocabularies padded to a real model's size (the `dummy:` models: 256 byte tokens
in a 128,256-id vocabulary) reach xgrammar compacted: only the ids that have bytes, plus
the stop ids. xgrammar treats every id without bytes as a special token and scans that
list on every `accept_token` and every mask fill (~23 us per accepted token at 128k ids,
~0.6 us at 256, measured on CPU), which no real tokenizer has; the ids left out can never
be allowed anyway. `_CompactIds` maps ids both ways and widens masks back to the model's
vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
import xgrammar as xgr

from radixmesh.worker.constrained.grammar import (
    CompilerSpec,
    CompileStopped,
    GrammarBackend,
    GrammarError,
    Matcher,
    choices_regex,
)
from radixmesh.worker.constrained.vocab import Vocab

# xgrammar prefixes messages with "[hh:mm:ss] /path/file.cc:123: "; the rest is the reason.
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class _CompactIds:
    """Our token ids <-> xgrammar's ids of a compacted vocabulary (see the module doc).

    The kept ids start with the identity (ids without bytes among them stay special
    tokens to xgrammar, as before), so a mask widens by copying whole words; the few kept
    ids after them (`tail`: the stop ids of a byte vocabulary) are moved bit by bit.
    """

    MAX_TAIL = 64  # more scattered ids than this: not worth compacting

    def __init__(self, kept: list[int], vocab_size: int) -> None:
        self.kept = kept
        self.vocab_size = vocab_size
        self.ours_to_theirs = {ours: j for j, ours in enumerate(kept)}
        prefix = 0
        while prefix < len(kept) and kept[prefix] == prefix:
            prefix += 1
        self.prefix_words = prefix // 32
        first_tail = 32 * self.prefix_words
        self.tail = [(j, kept[j]) for j in range(first_tail, len(kept))]

    @classmethod
    def of(cls, token_bytes: list[bytes | None], stop_ids: list[int]) -> _CompactIds | None:
        """Every id up to the last one with bytes, then the stop ids past it; None when
        that would not drop at least half of the vocabulary."""
        last = max((i for i, b in enumerate(token_bytes) if b), default=-1)
        kept = [*range(last + 1), *sorted(i for i in set(stop_ids) if i > last)]
        compact = cls(kept, len(token_bytes))
        if len(kept) * 2 > len(token_bytes) or len(compact.tail) > cls.MAX_TAIL:
            return None
        return compact

    def theirs(self, token: int) -> int | None:
        return self.ours_to_theirs.get(token)

    def widen(self, narrow: torch.Tensor, out: torch.Tensor, row0: int = 0) -> None:
        """Rows of a compact mask `narrow` [m, w] into rows row0.. of `out` [M, W]."""
        m, pw = narrow.shape[0], self.prefix_words
        dst = out[row0 : row0 + m]
        dst[:, :pw] = narrow[:, :pw]
        dst[:, pw:] = 0
        for j, ours in self.tail:
            bit = (narrow[:, j >> 5] >> (j & 31)) & 1
            dst[:, ours >> 5] |= bit << (ours & 31)


class XGrammarMatcher(Matcher):
    def __init__(self, compiled: xgr.CompiledGrammar, compact: _CompactIds | None = None) -> None:
        self._m = xgr.GrammarMatcher(compiled)
        self._compact = compact

    def accept_token(self, token: int) -> bool:
        if self._compact is not None:
            theirs = self._compact.theirs(token)
            return theirs is not None and bool(self._m.accept_token(theirs))
        return bool(self._m.accept_token(token))

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        compact = self._compact
        if compact is None:
            self._m.fill_next_token_bitmask(bitmask, row)
            return
        narrow = xgr.allocate_token_bitmask(1, len(compact.kept))
        self._m.fill_next_token_bitmask(narrow, 0)
        compact.widen(narrow, bitmask, row)

    def jump_forward_string(self) -> str:
        return str(self._m.find_jump_forward_string())

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"

    def __init__(self, vocab: Vocab) -> None:
        self._compact: _CompactIds | None = None
        if vocab.hf_tokenizer is not None:
            info = xgr.TokenizerInfo.from_huggingface(
                vocab.hf_tokenizer, vocab_size=vocab.vocab_size, stop_token_ids=vocab.stop_token_ids
            )
        else:  # raw bytes; empty entries are special tokens to xgrammar
            token_bytes, stop_ids = vocab.token_bytes, vocab.stop_token_ids
            self._compact = _CompactIds.of(token_bytes, stop_ids)
            if self._compact is not None:  # only the ids with bytes, and the stop ids
                ids = self._compact.ours_to_theirs
                token_bytes = [token_bytes[i] for i in self._compact.kept]
                stop_ids = [ids[i] for i in stop_ids]
            info = xgr.TokenizerInfo(
                [b or b"" for b in token_bytes],
                xgr.VocabType.RAW,
                vocab_size=len(token_bytes),
                stop_token_ids=stop_ids,
            )
        self._info = info
        self._compiler = XGrammarCompiler(info)
        # Fills the rows of a step on a thread pool (half the cores).
        self._batch = xgr.BatchGrammarMatcher(max_threads="auto")

    def compile(self, kind: str, text: str) -> Any:
        return self._compiler.compile(kind, text)

    def compiler_spec(self) -> CompilerSpec:
        return CompilerSpec(__name__, "XGrammarCompiler", (self._info.serialize_json(),))

    def load(self, data: str | bytes) -> Any:
        text = data.decode() if isinstance(data, bytes) else data
        try:
            return xgr.CompiledGrammar.deserialize_json(text, self._info)
        except (RuntimeError, ValueError) as e:
            raise GrammarError(f"the compiled grammar did not load: {_clean(str(e))}") from e

    def matcher(self, compiled: Any) -> Matcher:
        return XGrammarMatcher(compiled, self._compact)

    def fill_bitmasks(self, matchers: Sequence[Matcher], bitmask: torch.Tensor) -> None:
        inner = []
        for m in matchers:
            assert isinstance(m, XGrammarMatcher), type(m)
            inner.append(m._m)
        if self._compact is None:
            self._batch.batch_fill_next_token_bitmask(inner, bitmask)
            return
        narrow = xgr.allocate_token_bitmask(len(inner), len(self._compact.kept))
        self._batch.batch_fill_next_token_bitmask(inner, narrow)
        self._compact.widen(narrow, bitmask)


class XGrammarCompiler:
    """Compiles for one tokenizer (`TokenizerInfo`, or its JSON in a pool process)."""

    def __init__(self, info: xgr.TokenizerInfo | str) -> None:
        if isinstance(info, str):
            info = xgr.TokenizerInfo.deserialize_json(info)
        # Our own cache (compile_cache.py) keeps compiled grammars; one thread a compile.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, kind: str, text: str) -> xgr.CompiledGrammar:
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
            if kind == "structural_tag":
                return self._compiler.compile_grammar(xgr.Grammar.from_structural_tag(text))
        except (RuntimeError, ValueError) as e:
            if "bad_alloc" in str(e):  # out of memory, not a bad constraint
                raise MemoryError(str(e)) from None
            raise GrammarError(_clean(str(e))) from None
        raise GrammarError(f"unknown constraint kind {kind!r}")

    def compile_serialized(self, kind: str, text: str, max_bytes: int) -> str:
        """The compiled grammar as xgrammar's JSON, when that is estimated at most
        `max_bytes`: the JSON writes every rule's automaton with a copy of the complete
        automaton (cost.py), so it weighs about rules x the grammar's text (measured
        0.8-4x that), and serializing a 200-rule schema's can take seconds and gigabytes.
        The estimate is measured here, after the compile and before serializing."""
        compiled = self.compile(kind, text)
        grammar = str(compiled.grammar)  # one line per rule; ~ms
        rules = grammar.count("\n")
        estimate = rules * len(grammar)
        if estimate > max_bytes:
            raise CompileStopped(
                f"compiled to a grammar of {rules} rules that would serialize to about "
                f"{estimate >> 20} MiB; at most {max_bytes >> 20} MiB are allowed"
            )
        return str(compiled.serialize_json())


# xgrammar 0.2.9 writes the characters of a length-bounded JSON string (minLength /
# maxLength) as `[^"\\\r\n]`, which admits raw control characters (invalid JSON: a random
# model emits them). Its unbounded strings use the right class; use it for both.
_BOUNDED_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\]"


def _json_safe(ebnf: str) -> str:
    return ebnf.replace(_BOUNDED_STRING_CHAR, _JSON_STRING_CHAR)


def _clean(message: str) -> str:
    return _LOG_PREFIX.sub("", message.strip())
