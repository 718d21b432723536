"""Asynchronous grammar compilation with a cache of compiled grammars.

`get(kind, text)` returns a future at once: the cached one when the same constraint was
seen before (compiled or still compiling), else a new compile. Failures are cached too,
so a repeated bad (or too expensive) constraint costs nothing. Keys are (kind, text)
within one cache; a cache belongs to one backend built for one tokenizer, whose
fingerprint is part of the key anyway so caches can never be shared across tokenizers.

Compiles run in the compile pool's processes (compile_pool.py); what they send back is
loaded into a grammar on one thread here, never on the scheduler thread or an event loop.
The cache holds at most `max_entries` grammars and about `max_bytes` of them (their
serialized size), dropping the least recently used first.

`announce(kind, key)` (optional) hears each grammar that compiled and is still held
("grammar_compiled") and each such grammar dropped later ("grammar_evicted"), with its
`radixmesh.grammar_key`: the worker tells the routers (grammar affinity). It is called
under the cache's lock, so one grammar's announcements come in the order they happened;
it must only hand them on (a queue put).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

from radixmesh.grammar_key import grammar_key
from radixmesh.worker.constrained.cost import CompileCost, estimate
from radixmesh.worker.constrained.grammar import GrammarBackend, GrammarError

Submit = Callable[[str, str, int], "Future[str | bytes]"]
GrammarEventKind = Literal["grammar_compiled", "grammar_evicted"]
Announce = Callable[[GrammarEventKind, int], None]  # (what happened, the grammar's key)
_Key = tuple[str, str, str, str]


class CompileCache:
    def __init__(
        self,
        backend: GrammarBackend,
        tokenizer_key: str,
        *,
        submit: Submit | None = None,
        max_entries: int = 1024,
        max_bytes: int = 256 * 1024 * 1024,
        announce: Announce | None = None,
    ) -> None:
        """`submit(kind, text, weight)`: compile elsewhere and return the serialized
        grammar (compile_pool.CompilePool.submit); None: `backend.compile` on a thread
        here."""
        self.backend = backend
        self.tokenizer_key = tokenizer_key
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._submit = submit
        self._announce = announce
        self._announced: set[_Key] = set()  # compiled, held, and announced as such
        # Loads results (and, without `submit`, compiles) off every caller's thread.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="radixmesh-grammar")
        self._futures: OrderedDict[_Key, Future[Any]] = OrderedDict()
        self._sizes: dict[_Key, int] = {}
        self._bytes = 0
        # Reentrant: a compile done at once runs its callback inside `get`, under the lock.
        self._lock = threading.RLock()
        self.hits = 0
        self.misses = 0

    def get(self, kind: str, text: str, cost: CompileCost | None = None) -> Future[Any]:
        """`cost`: the constraint's estimated cost (limits.py's check), which orders the
        compile queue; None: estimated here if it has to compile. Raises what `submit`
        raises (Overloaded), and then caches nothing."""
        key = (self.backend.name, self.tokenizer_key, kind, text)
        with self._lock:
            fut = self._futures.get(key)
            if fut is not None:
                self._futures.move_to_end(key)
                self.hits += 1
                return fut
            fut = self._start(key, kind, text, cost)
            self.misses += 1
            self._futures[key] = fut
            self._evict()  # (before the callback: what it drops is announced first)
            if self._submit is None:  # compiled here: held once done (maybe at once, here)
                fut.add_done_callback(lambda f: self._compiled_here(key, f))
            return fut

    def _start(self, key: _Key, kind: str, text: str, cost: CompileCost | None) -> Future[Any]:
        if self._submit is None:
            return self._pool.submit(self.backend.compile, kind, text)
        out: Future[Any] = Future()
        remote = self._submit(kind, text, (cost or estimate(kind, text)).weight)
        remote.add_done_callback(lambda f: self._load_later(key, f, out))
        return out

    def _load_later(self, key: _Key, remote: Future[str | bytes], out: Future[Any]) -> None:
        try:
            self._pool.submit(self._load, key, remote, out)
        except RuntimeError:  # shut down
            out.set_exception(GrammarError("the worker is shutting down"))

    def _load(self, key: _Key, remote: Future[str | bytes], out: Future[Any]) -> None:
        try:
            data = remote.result()
            grammar = self.backend.load(data)
        except BaseException as e:
            if not isinstance(e, GrammarError):
                # The server's failure (no compile process), not the constraint's: kept,
                # it would fail every later request with this constraint; dropped, the
                # next one compiles again.
                with self._lock:
                    if self._futures.get(key) is out:
                        del self._futures[key]
            out.set_exception(e)
            return
        # Announced before its requests hear of it: the worker's event leads their outputs.
        self._held(key, out, len(data))
        out.set_result(grammar)

    def _compiled_here(self, key: _Key, fut: Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self._held(key, fut, 0)

    def _held(self, key: _Key, fut: Future[Any], size: int) -> None:
        """`fut` compiled: count its size and announce it, if the cache still holds it."""
        with self._lock:
            if self._futures.get(key) is fut:
                self._sizes[key] = size
                self._bytes += size
                if self._announce is not None:
                    self._announced.add(key)
                    self._announce("grammar_compiled", grammar_key(key[2], key[3]))
                self._evict()

    def _evict(self) -> None:
        # Requests that hold an evicted future keep it; only the cache lets go.
        while len(self._futures) > self.max_entries or (
            self._bytes > self.max_bytes and len(self._futures) > 1
        ):
            key, _ = self._futures.popitem(last=False)
            self._bytes -= self._sizes.pop(key, 0)
            if key in self._announced:
                self._announced.discard(key)
                assert self._announce is not None
                self._announce("grammar_evicted", grammar_key(key[2], key[3]))

    def __len__(self) -> int:
        return len(self._futures)

    @property
    def num_bytes(self) -> int:
        """The serialized size of the grammars held (those compiled in this process: 0)."""
        return self._bytes

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
