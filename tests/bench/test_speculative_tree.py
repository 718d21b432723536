"""bench/speculative_tree.py's replay: its chain is the n-gram drafter's draft, its trees
add the other occurrences' continuations, and a step advances by what it keeps + 1."""

from __future__ import annotations

import random

import pytest

from bench.speculative_tree import Occurrences, replay, row_cost, trie_nodes
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.request import Request
from radixmesh.worker.speculative.ngram import NgramDrafter


def test_the_chain_is_the_ngram_drafters_draft() -> None:
    rng = random.Random(5)
    ids = [rng.randrange(6) for _ in range(400)]  # a small alphabet: many repeats
    drafter = NgramDrafter(2, 4)
    owner = Request(rid="r", prompt_ids=[1, 2], params=SamplingParams())
    occ = Occurrences(2, 4)
    drafted = 0
    for end in range(2, len(ids)):
        want = drafter.lookup(owner, ids[:end], 4)
        got = occ.chains(ids[:end], 4, 1)
        assert (got[0] if got else []) == want
        drafted += bool(want)
    assert drafted > 300


def test_branches_are_the_other_occurrences_distinct_continuations() -> None:
    # "1 2" occurs before the end three times: followed by 7 7, by 8 8 and by 7 7 again.
    ids = [1, 2, 7, 7, 0, 1, 2, 8, 8, 0, 1, 2, 7, 7, 0, 5, 1, 2]
    assert Occurrences(2, 2).chains(ids, 2, 3) == [[7, 7], [8, 8]]
    assert Occurrences(2, 2).chains(ids, 2, 1) == [[7, 7]]  # the latest occurrence's
    assert trie_nodes([[7, 7], [8, 8], [7, 9]]) == 5


def test_a_step_keeps_the_longest_branch_match_and_adds_one() -> None:
    prompt, output = [5, 6, 7, 8, 9, 5, 6], [7, 8, 9, 1]
    # After the prefill's 7: "5 6 7" occurred before, followed by 8 9 (2 drafts: room
    # for 2 before the output's end), both kept, then one more token: done in one step.
    assert replay(prompt, output, 4, 1, Occurrences(2, 4)) == {
        "steps": 1,
        "drafting_steps": 1,
        "accepted": 2,
        "rows": [3],
    }
    prompt, output = [1, 2, 7, 7, 0, 1, 2, 8, 8, 0, 1], [2, 7, 7, 3]
    # The chain follows "0 1 2" -> 8 8 (nothing kept), then "1 2 7" -> 7 (kept).
    assert replay(prompt, output, 4, 1, Occurrences(2, 4)) == {
        "steps": 2,
        "drafting_steps": 2,
        "accepted": 1,
        "rows": [3, 2],
    }
    # Two branches add "1 2" -> 7 7 beside 8 8: both kept in the first step.
    assert replay(prompt, output, 4, 2, Occurrences(2, 4)) == {
        "steps": 1,
        "drafting_steps": 1,
        "accepted": 2,
        "rows": [5],
    }


def test_row_cost_through_the_measured_points() -> None:
    assert row_cost(1) == pytest.approx(1.0)
    assert row_cost(5) == pytest.approx(1.14)
    assert row_cost(9) == pytest.approx(1.18)
    assert row_cost(7) == pytest.approx(1.16)
    assert row_cost(13) == pytest.approx(1.22)  # past the last point, the last slope
