"""The grammar-backend interface: compile a constraint once, then one matcher per request.

A backend is built for one tokenizer (the model's) and one vocabulary size. Compiles may
be slow and a client controls their cost, so the worker runs them in other processes
(compile_pool.py): a backend describes its compiler there with a picklable
`CompilerSpec`, and `load`s what that compiler sends back. Everything on `Matcher` runs
on the scheduler thread, once per request per step, and must be cheap.

Bitmask layout (shared by every backend and by `bitmask.py`): int32 `[rows, ceil(V / 32)]`,
bit `t % 32` of word `t // 32` set when token `t` is allowed.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

KINDS = ("regex", "json_schema", "ebnf", "choices", "structural_tag")


class GrammarError(Exception):
    """The constraint does not compile; the message is the compiler's own words."""


class CompileStopped(GrammarError):
    """The compile was stopped at a limit (time, CPU, memory); the message reads on from
    "the <constraint> " ("did not compile within 10 s ...")."""


class GrammarCompiler(Protocol):
    """A backend's compiler in a pool process: the compiled grammar, serialized, or
    CompileStopped when that would be more than `max_bytes`."""

    def compile_serialized(self, kind: str, text: str, max_bytes: int) -> str | bytes: ...


@dataclass(frozen=True)
class CompilerSpec:
    """How another process builds a backend's compiler: `module.factory(*args)`."""

    module: str
    factory: str
    args: tuple[Any, ...]

    def build(self) -> GrammarCompiler:
        factory = getattr(importlib.import_module(self.module), self.factory)
        compiler: GrammarCompiler = factory(*self.args)
        return compiler


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
        opaque compiled grammar, in this process. Raises GrammarError with the compiler's
        message."""

    @abstractmethod
    def compiler_spec(self) -> CompilerSpec:
        """The compiler of this backend for a pool process (compile_pool.py)."""

    @abstractmethod
    def load(self, data: str | bytes) -> Any:
        """The compiled grammar that this backend's compiler serialized as `data`."""

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
