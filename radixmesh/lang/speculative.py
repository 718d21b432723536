"""API speculative execution (`@function(num_api_spec_tokens=N)`), for APIs billed per call.

Completion models: the first gen asks for N tokens without stop strings; it and the gens
after it take their text from that speculation up to their own stop string, and constant
text the program appends in between must match the speculation's next characters (or
the speculation is dropped and the next gen calls the model again).

Chat models: inside an assistant turn, the program's constant text and gens are recorded
as a format; when the turn ends one call writes the whole turn and the reply is matched
against the format (each gen's text runs to its stop string), up to `MAX_TRIES` calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.lang.backend.base import Backend, Context

MAX_TRIES = 3


def _stops(stop: Any) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def _find_stop(text: str, stop: Any) -> int:
    """Where the earliest stop string starts in `text` (-1: none)."""
    found = [p for p in (text.find(s) for s in _stops(stop)) if p >= 0]
    return min(found) if found else -1


class CompletionSpeculation:
    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens
        self.text = ""  # speculated text not yet consumed

    def fill(self, value: str) -> None:
        self.text = self.text[len(value) :] if self.text.startswith(value) else ""

    async def gen(
        self, backend: Backend, ctx: Context, params: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        meta: dict[str, Any] = {}
        limit = params.get("max_new_tokens", 128)
        if not self.text:
            call = {k: v for k, v in params.items() if k != "stop"}
            call["max_new_tokens"] = max(limit, self.num_tokens)
            text, meta = await backend.agenerate(ctx, call)
            if not isinstance(text, str):
                raise InvalidArgument("n", "speculative execution generates one completion")
            self.text = text
        pos = _find_stop(self.text, params.get("stop"))
        if pos < 0:
            pos = min(limit, len(self.text))  # SGLang's cut: max_new_tokens characters
        taken, self.text = self.text[:pos], self.text[pos:]
        return taken, meta


@dataclass
class Term:
    text: str  # constant text, or what the model wrote for a gen
    is_gen: bool
    name: str | None = None  # the gen's variable
    stop: Any = None


@dataclass
class ChatSpeculation:
    num_tokens: int
    terms: list[Term] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def fill(self, value: str) -> None:
        if value:
            self.terms.append(Term(value, False))

    def gen(self, name: str | None, params: dict[str, Any]) -> None:
        for key, value in params.items():
            if key in ("stop", "max_new_tokens"):
                continue
            if self.params.setdefault(key, value) != value:
                raise InvalidArgument(
                    key,
                    "the gens of one speculated assistant turn must share their sampling "
                    f"parameters ({key}: {self.params[key]!r} vs {value!r})",
                )
        self.terms.append(Term("", True, name, params.get("stop")))

    async def finish(self, backend: Backend, ctx: Context) -> list[Term]:
        """One call for the turn; the terms with each gen's text filled in."""
        terms, self.terms = self.terms, []
        params, self.params = {**self.params, "max_new_tokens": self.num_tokens}, {}
        if not any(t.is_gen for t in terms):
            return terms
        for _ in range(MAX_TRIES):
            reply, _meta = await backend.agenerate(ctx, params)
            matched = _match(terms, reply if isinstance(reply, str) else reply[0])
            if matched is not None:
                return matched
        raise ValueError(
            f"speculative execution: {MAX_TRIES} replies did not follow the turn's format "
            f"{[t.text if not t.is_gen else '{' + str(t.name) + '}' for t in terms]}"
        )


def _match(terms: list[Term], reply: str) -> list[Term] | None:
    out: list[Term] = []
    for i, term in enumerate(terms):
        if not term.is_gen:
            if not reply.startswith(term.text):
                return None
            reply = reply[len(term.text) :]
            out.append(term)
            continue
        pos = _find_stop(reply, term.stop)
        if pos < 0 and i < len(terms) - 1:
            return None
        text = reply if pos < 0 else reply[:pos]
        reply = reply[len(text) :]
        out.append(Term(text, True, term.name, term.stop))
    return out
