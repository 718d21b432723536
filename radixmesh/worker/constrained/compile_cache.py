"""Asynchronous grammar compilation with a cache of compiled grammars.

`get(kind, text)` returns a future at once: the cached one when the same constraint was
seen before (compiled or still compiling), else a new compile on the pool. Failures are
cached too, so a repeated bad schema costs nothing. Keys are (kind, text) within one
cache; a cache belongs to one backend built for one tokenizer, whose fingerprint is part
of the key anyway so caches can never be shared across tokenizers by mistake.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from radixmesh.worker.constrained.grammar import GrammarBackend


class CompileCache:
    def __init__(
        self,
        backend: GrammarBackend,
        tokenizer_key: str,
        *,
        max_workers: int = 1,
        max_entries: int = 1024,
    ) -> None:
        self.backend = backend
        self.tokenizer_key = tokenizer_key
        self.max_entries = max_entries
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="radixmesh-grammar")
        self._futures: OrderedDict[tuple[str, str, str, str], Future[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, kind: str, text: str) -> Future[Any]:
        key = (self.backend.name, self.tokenizer_key, kind, text)
        with self._lock:
            fut = self._futures.get(key)
            if fut is not None:
                self._futures.move_to_end(key)
                self.hits += 1
                return fut
            self.misses += 1
            fut = self._pool.submit(self.backend.compile, kind, text)
            self._futures[key] = fut
            while len(self._futures) > self.max_entries:
                self._futures.popitem(last=False)  # requests holding it keep their future
            return fut

    def __len__(self) -> int:
        return len(self._futures)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
