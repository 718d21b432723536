"""Prompt-lookup drafts: what followed the latest earlier occurrence of the sequence's
last n tokens (n from `max_n` down to `min_n`), from the request's own prompt and output.
The latest occurrence, not the first: in edits and rewrites the text being copied is the
one most recently read.

Each request keeps an index per n from n-gram to the end of its latest occurrence, grown
by the tokens added since the last call (amortized O(new tokens x n values) a step, not
a scan of the sequence). The index of a request goes when the request does (weak keys).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from radixmesh.worker.request import Request


@dataclass
class _Index:
    indexed: int = 0  # n-grams ending at positions <= indexed are in `ends`
    ends: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)


class NgramDrafter:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self._indexes: weakref.WeakKeyDictionary[Request, _Index] = weakref.WeakKeyDictionary()

    def propose(self, req: Request, k: int) -> list[int]:
        return self.lookup(req, req.token_ids, k)

    def lookup(self, owner: Request, ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of ids' longest
        indexed suffix; [] when none of its last min_n..max_n tokens occurred before."""
        index = self._indexes.get(owner)
        if index is None:
            index = self._indexes[owner] = _Index(
                ends={n: {} for n in range(self.min_n, self.max_n + 1)}
            )
        end = len(ids)
        # Index the n-grams ending before the sequence's end: the suffix itself must match
        # an earlier occurrence, not itself.
        for e in range(max(index.indexed + 1, self.min_n), end):
            for n, table in index.ends.items():
                if n <= e:
                    table[tuple(ids[e - n : e])] = e
        index.indexed = max(index.indexed, end - 1)
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            at = index.ends[n].get(tuple(ids[end - n :]))
            if at is not None:
                return continuation(ids, at, k)
        return []


def continuation(ids: list[int], at: int, k: int) -> list[int]:
    """The k tokens that follow position `at` of `ids` (the end of an earlier occurrence
    of its suffix). Past the sequence's end the text repeats with period len(ids) - at (a
    run of the same token, a repeated phrase): the draft continues the repeat."""
    period = len(ids) - at
    return [ids[at + i % period] for i in range(k)]
