"""Stop regexes (SGLang's `stop_regex`): a generation ends when one matches its text.

Each pattern is searched after every step in the text's tail: the last `WINDOW` emitted
characters plus the new text. The window bounds the work of a step whatever the output's
length, and a match longer than the window (which `MAX_CHARS`-long patterns rarely need)
is not found; SGLang searches a tail too (its patterns' longest match).

A pattern is a client's: Python's `re` backtracks, and a pattern like `(a+)+$` takes
exponential time on a window of `a`s, on the scheduler thread that serves everyone. So
patterns are compiled and searched with the `regex` package (Python's `re` syntax), whose
search takes a timeout: a search past `SEARCH_TIMEOUT` seconds ends the request with an
error naming `stop_regex`, and a step costs at most `MAX_PATTERNS * SEARCH_TIMEOUT` per
request whatever the pattern.

The text ends with the match, which is kept (as in SGLang's output, whose stop trimming
looks for the pattern's own text): streamed text is never retracted, and a regex has no
"might start a match" test to hold text back with, so trimming could cut only part of a
match. The finish reason is STOP with the pattern as the matched text.
"""

from __future__ import annotations

from collections.abc import Sequence

import regex

MAX_PATTERNS = 8
MAX_CHARS = 256
WINDOW = 256  # emitted characters searched again with the new text
SEARCH_TIMEOUT = 0.005  # seconds one search of one pattern may take


def compile_patterns(patterns: Sequence[str]) -> list[regex.Pattern[str]]:
    """The patterns compiled; ValueError saying which one does not compile and why."""
    compiled = []
    for p in patterns:
        try:
            compiled.append(regex.compile(p))
        except (regex.error, RecursionError, OverflowError) as e:
            raise ValueError(f"{p[:64]!r} is not a regular expression: {e}") from None
    return compiled


class StopRegexTimeout(Exception):
    """A pattern's search took longer than SEARCH_TIMEOUT."""


class StopRegexes:
    """One request's stop regexes over its text's tail."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        self._compiled = compile_patterns(self.patterns)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def first_match(self, emitted: str, new: str) -> tuple[int, int, str] | None:
        """(start, end, pattern) in `new`'s coordinates (start may be negative: the match
        began in emitted text) of the match that ends first, the earliest-starting one
        among those; None when none matches. Raises StopRegexTimeout."""
        tail = emitted[-WINDOW:]
        window = tail + new
        best: tuple[int, int, str] | None = None
        for pattern, compiled in zip(self.patterns, self._compiled, strict=True):
            try:
                m = compiled.search(window, timeout=SEARCH_TIMEOUT)
            except TimeoutError:
                raise StopRegexTimeout(
                    f"stop_regex: {pattern[:64]!r} took longer than "
                    f"{SEARCH_TIMEOUT * 1000:g} ms to search the text's last "
                    f"{len(window)} characters"
                ) from None
            if m is None:
                continue
            hit = (m.end() - len(tail), m.start() - len(tail), pattern)
            if best is None or hit[:2] < best[:2]:
                best = hit
        return None if best is None else (best[1], best[0], best[2])
