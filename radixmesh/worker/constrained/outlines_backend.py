"""outlines-core: regex (and JSON schema / choices through a regex) compiled into a
token-level DFA index (the second backend; no EBNF).

Its index works on tokens, not characters, so the forced string is read off the token
level: when a state allows only a few tokens (not EOS), the bytes they all begin with
are forced. That finds the fixed keys of a compact JSON template one token's worth at a
time, less than xgrammar's character-level view; it is enough for ablations.
"""

from __future__ import annotations

import pickle
from typing import Any

import outlines_core as oc
import torch

from radixmesh.worker.constrained.grammar import (
    CompilerSpec,
    CompileStopped,
    GrammarBackend,
    GrammarError,
    Matcher,
    choices_regex,
)
from radixmesh.worker.constrained.vocab import Vocab

# Above this many allowed tokens the next text is not forced (skip the prefix scan).
_FORCED_SCAN_LIMIT = 64


class OutlinesMatcher(Matcher):
    def __init__(self, index: Any, eos_id: int, token_bytes: list[bytes | None]) -> None:
        self._guide = oc.Guide(index, max_rollback=64)
        self._eos = eos_id
        self._bytes = token_bytes
        self._terminated = False

    def accept_token(self, token: int) -> bool:
        if self._terminated:
            return False
        if token == self._eos:  # the guide stays in its final state; termination is ours
            self._terminated = bool(self._guide.is_finished())
            return self._terminated
        try:
            self._guide.advance(token, return_tokens=False)
        except (ValueError, RuntimeError):
            return False
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._terminated:
            self._terminated = False
            num_tokens -= 1
        if num_tokens:
            self._guide.rollback_state(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        words = bitmask[row]
        words.zero_()
        self._guide.write_mask_into(words.data_ptr(), words.numel(), words.element_size())

    def jump_forward_string(self) -> str:
        if self._terminated or self._guide.is_finished():
            return ""
        allowed = self._guide.get_tokens()
        if len(allowed) > _FORCED_SCAN_LIMIT or self._eos in allowed:
            return ""
        texts = [self._bytes[t] for t in allowed]
        if not texts or any(b is None for b in texts):
            return ""
        return _common_prefix([b for b in texts if b is not None]).decode("utf-8", errors="ignore")

    def is_terminated(self) -> bool:
        return self._terminated


class OutlinesBackend(GrammarBackend):
    name = "outlines"

    def __init__(self, vocab: Vocab) -> None:
        self._eos = vocab.stop_token_ids[0]
        self._bytes = vocab.token_bytes
        self._table: dict[bytes, list[int]] = {}
        for i, b in enumerate(self._bytes):
            if b is not None and i not in vocab.stop_token_ids:
                self._table.setdefault(b, []).append(i)
        self._compiler = OutlinesCompiler(self._eos, self._table)

    def compile(self, kind: str, text: str) -> Any:
        return self._compiler.compile(kind, text)

    def compiler_spec(self) -> CompilerSpec:
        return CompilerSpec(__name__, "OutlinesCompiler", (self._eos, self._table))

    def load(self, data: str | bytes) -> Any:
        # The bytes come from this worker's own compile process (never from a client).
        assert isinstance(data, bytes)
        return pickle.loads(data)

    def matcher(self, compiled: Any) -> Matcher:
        return OutlinesMatcher(compiled, self._eos, self._bytes)


class OutlinesCompiler:
    """Builds token-level indexes over one vocabulary (here or in a pool process)."""

    def __init__(self, eos: int, table: dict[bytes, list[int]]) -> None:
        self._vocab = oc.Vocabulary(eos, table)

    def compile(self, kind: str, text: str) -> Any:
        try:
            if kind == "json_schema":
                regex = oc.json_schema.build_regex_from_schema(text, whitespace_pattern="")
            elif kind == "regex":
                regex = text
            elif kind == "choices":
                regex = choices_regex(text.split("\x00"))
            else:
                raise GrammarError(f"the outlines backend does not support {kind}")
            return oc.Index(regex, self._vocab)
        except (ValueError, RuntimeError, TypeError) as e:
            raise GrammarError(str(e)) from None

    def compile_serialized(self, kind: str, text: str, max_bytes: int) -> bytes:
        data = pickle.dumps(self.compile(kind, text))
        if len(data) > max_bytes:  # an index pickles in linear time: measured after
            raise CompileStopped(
                f"compiled to {len(data) >> 20} MiB; at most {max_bytes >> 20} MiB are allowed"
            )
        return data


def _common_prefix(items: list[bytes]) -> bytes:
    lo, hi = min(items), max(items)  # the sorted extremes share what all of them share
    n = 0
    while n < min(len(lo), len(hi)) and lo[n] == hi[n]:
        n += 1
    return lo[:n]
