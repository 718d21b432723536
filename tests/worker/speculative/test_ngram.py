"""The n-gram drafter against a brute-force lookup, and its rules one by one."""

from __future__ import annotations

import random

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.request import Request
from radixmesh.worker.speculative.ngram import NgramDrafter


def _req(ids: list[int]) -> Request:
    return Request(rid="r", prompt_ids=ids, params=SamplingParams())


def _brute(ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    end = len(ids)
    for n in range(min(max_n, end), min_n - 1, -1):
        suffix = ids[end - n :]
        for at in range(end - 1, n - 1, -1):  # latest earlier occurrence ends at `at`
            if ids[at - n : at] == suffix:
                period = end - at
                return [ids[at + i % period] for i in range(k)]
    return []


def test_latest_occurrence_of_the_longest_suffix() -> None:
    d = NgramDrafter(min_n=1, max_n=3)
    #        0  1  2  3  4  5  6  7  8  9
    ids = [5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7]
    # suffix (6, 7) occurs ending at 3 and at 7: the latest (7) -> 9, 2, 6, 7
    assert d.propose(_req(ids), 4) == [9, 2, 6, 7]
    d2 = NgramDrafter(min_n=1, max_n=3)
    ids2 = [1, 2, 3, 9, 4, 2, 3, 8, 1, 2, 3]
    # (1, 2, 3) ends at 3 -> 9, 4 (longer match beats the later (2, 3) at 7)
    assert d2.propose(_req(ids2), 2) == [9, 4]


def test_no_match_and_short_sequences() -> None:
    d = NgramDrafter(min_n=2, max_n=4)
    assert d.propose(_req([1, 2, 3, 4]), 4) == []
    assert d.propose(_req([7]), 4) == []


def test_a_repeat_continues_past_the_end() -> None:
    d = NgramDrafter(min_n=1, max_n=2)
    assert d.propose(_req([4, 9, 9, 9]), 5) == [9, 9, 9, 9, 9]
    d2 = NgramDrafter(min_n=2, max_n=2)
    assert d2.propose(_req([1, 2, 1, 2]), 5) == [1, 2, 1, 2, 1]


def test_incremental_index_equals_brute_force() -> None:
    rng = random.Random(7)
    for trial in range(40):
        min_n, max_n = rng.choice([(1, 1), (1, 3), (2, 4), (3, 3)])
        d = NgramDrafter(min_n, max_n)
        req = _req([rng.randrange(5) for _ in range(rng.randrange(1, 6))])
        for _ in range(60):  # the sequence grows by 1-3 tokens between lookups
            k = rng.randrange(1, 7)
            assert d.propose(req, k) == _brute(req.token_ids, k, min_n, max_n), trial
            req.token_ids.extend(rng.randrange(5) for _ in range(rng.randrange(1, 4)))
