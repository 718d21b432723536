"""The compile cache announces each grammar that compiled into it and each one it drops,
by key, in order: what the worker tells the routers (grammar affinity)."""

from __future__ import annotations

import queue
from concurrent.futures import Future
from typing import Any

from radixmesh.grammar_key import grammar_key
from radixmesh.worker.constrained.compile_cache import CompileCache, GrammarEventKind
from radixmesh.worker.constrained.grammar import GrammarError


class EchoBackend:
    """Compiles any text but "bad" (a GrammarError); loads what it compiled."""

    name = "echo"

    def compile(self, kind: str, text: str) -> str:
        if text == "bad":
            raise GrammarError("bad")
        return text

    def load(self, data: str | bytes) -> str | bytes:
        return data


def _done(kind: str, text: str, weight: int) -> Future[str | bytes]:
    fut: Future[str | bytes] = Future()
    if text == "bad":
        fut.set_exception(GrammarError("bad"))
    else:
        fut.set_result(text)
    return fut


def _cache(heard: queue.Queue[tuple[str, int]], remote: bool) -> CompileCache:
    def announce(kind: GrammarEventKind, key: int) -> None:
        heard.put((kind, key))

    backend: Any = EchoBackend()
    return CompileCache(
        backend, "tok", submit=_done if remote else None, max_entries=2, announce=announce
    )


def _next(heard: queue.Queue[tuple[str, int]]) -> tuple[str, int]:
    return heard.get(timeout=10)


def test_compiles_and_evictions_are_announced_in_order() -> None:
    for remote in (True, False):  # compiled in the pool's processes, or on a thread here
        heard: queue.Queue[tuple[str, int]] = queue.Queue()
        cache = _cache(heard, remote)
        a, b, c = (grammar_key("regex", t) for t in ("a", "b", "c"))
        cache.get("regex", "a").result(timeout=10)
        assert _next(heard) == ("grammar_compiled", a)
        cache.get("regex", "b").result(timeout=10)
        assert _next(heard) == ("grammar_compiled", b)
        cache.get("regex", "a")  # a hit: nothing to announce; "b" is now the oldest
        cache.get("regex", "c").result(timeout=10)  # drops "b"
        assert [_next(heard), _next(heard)] == [("grammar_evicted", b), ("grammar_compiled", c)]
        assert heard.empty()
        cache.shutdown()


def test_a_failed_compile_is_never_announced() -> None:
    heard: queue.Queue[tuple[str, int]] = queue.Queue()
    cache = _cache(heard, remote=True)
    bad = cache.get("regex", "bad")
    assert isinstance(bad.exception(timeout=10), GrammarError)
    cache.get("regex", "a").result(timeout=10)
    cache.get("regex", "b").result(timeout=10)  # drops "bad" (held as a failure): unheard
    assert [_next(heard), _next(heard)] == [
        ("grammar_compiled", grammar_key("regex", "a")),
        ("grammar_compiled", grammar_key("regex", "b")),
    ]
    cache.get("regex", "c").result(timeout=10)  # drops "a"
    assert [_next(heard), _next(heard)] == [
        ("grammar_evicted", grammar_key("regex", "a")),
        ("grammar_compiled", grammar_key("regex", "c")),
    ]
    cache.shutdown()
