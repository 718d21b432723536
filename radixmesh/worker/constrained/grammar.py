"""The grammar-backend interface: compile a constraint once, then one matcher per request.

A backend is built for one tokenizer (the model's) and one vocabulary size. `compile` is
called from a worker thread pool and may be slow; everything on `Matcher` runs on the
scheduler thread, once per request per step, and must be cheap.

Bitmask layout (shared by every backend and by `bitmask.py`): int32 `[rows, ceil(V / 32)]`,
bit `t % 32` of word `t // 32` set when token `t` is allowed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

KINDS = ("regex", "json_schema", "ebnf", "choices", "structural_tag")


class GrammarError(Exception):
    """The constraint does not compile; the message is the compiler's own words."""


class Matcher(ABC):
    """One request's position in a compiled grammar.

    It has accepted exactly the request's generated tokens, in order. The stop token
    (EOS) is accepted like any other token and terminates the matcher.
    """

    @abstractmethod
    def accept_token(self, token: int) -> bool:
        """Advance by `token`; False (and no state change) when the grammar forbids it."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (at most the ones accepted in the
        current step: jump-forward rolls back only the boundary token)."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into row `row` of `bitmask` (see module doc)."""

    @abstractmethod
    def jump_forward_string(self) -> str:
        """The text every continuation starts with ('' when the next character is free)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether the stop token has been accepted."""


class GrammarBackend(ABC):
    """Compiles constraints for one tokenizer; `compile` must be thread-safe."""

    name: str

    @abstractmethod
    def compile(self, kind: str, text: str) -> Any:
        """Compile `text` of kind `kind` (one of KINDS; choices are '\\x00'-joined) into an
        opaque compiled grammar. Raises GrammarError with the compiler's message."""

    @abstractmethod
    def matcher(self, compiled: Any) -> Matcher:
        """A fresh matcher at the start of `compiled`."""

    def fill_bitmasks(self, matchers: Sequence[Matcher], bitmask: torch.Tensor) -> None:
        """Row j of `bitmask` for `matchers[j]`, for every j (a backend may fill the rows
        in parallel; this default fills them one by one)."""
        fill_each(matchers, bitmask)


def fill_each(matchers: Sequence[Matcher], bitmask: torch.Tensor) -> None:
    """Row j of `bitmask` for `matchers[j]`, one matcher at a time."""
    for j, m in enumerate(matchers):
        m.fill_bitmask(bitmask, j)


def choices_regex(choices: list[str]) -> str:
    """A regex matching exactly one of `choices` (literal strings)."""
    return "(" + "|".join(_escape(c) for c in choices) + ")"


_REGEX_META = set("\\.^$|?*+()[]{}-/")


def _escape(text: str) -> str:
    # Escape only the metacharacters: both regex dialects (xgrammar's and Rust's) accept
    # `\` before these, while some reject it before ordinary characters.
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in text)
