"""One constrained request's grammar state, as its `Request` holds it."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from radixmesh.worker.constrained.grammar import Matcher
from radixmesh.worker.request_output import GrammarCounts


@dataclass(eq=False)
class RequestGrammar:
    """One request's constraint: its compile future, then its matcher and counters."""

    kind: str
    future: Future[Any]
    matcher: Matcher | None = None
    error: str | None = None
    dead_end: bool = False
    num_forced_tokens: int = 0  # appended by jump-forward, never sampled
    num_jumps: int = 0
    num_sampled: int = 0  # decode steps that sampled for this request
    started: bool = False  # jump_at_start has run

    def counts(self) -> GrammarCounts:
        return GrammarCounts(self.num_forced_tokens, self.num_jumps, self.num_sampled)
