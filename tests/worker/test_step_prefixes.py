"""Admission over a long queue: in-step prefix deferral by index, and the per-step cap on
prefix matches of requests it passes over (scheduler._admit, step_prefixes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.worker.config import SchedulerConfig
from radixmesh.worker.worker import Worker
from tests.worker.factories import (
    RecordedRequest,
    Recorder,
    all_free_after_flush,
    make_request,
    make_worker,
    run_to_completion,
)

PREFIXES = [list(range(100 + 30 * g, 124 + 30 * g)) for g in range(3)]  # 3 x 24 tokens


def _groups(w: Worker, per_group: int) -> list[RecordedRequest]:
    reqs = []
    for g, prefix in enumerate(PREFIXES):
        for i in range(per_group):
            own = [20 + i, 30 + i, 40 + i, 50 + g]
            reqs.append(make_request(w, [*prefix, *own], rid=f"g{g}-{i}", max_new_tokens=2))
    return reqs


@pytest.mark.parametrize("limit", [1, 64])
def test_a_new_prefix_is_computed_once_per_group_over_a_long_queue(limit: int) -> None:
    # 18 waiting requests, past the lpm fallback: fcfs order, groups arriving together.
    w = make_worker(
        policy_fallback_queue_len=4,
        in_batch_prefix_threshold=8,
        max_num_batched_tokens=100,
        max_running_requests=32,
        admission_match_limit=limit,
    )
    rec = Recorder().attach(w)
    reqs = _groups(w, 6)
    for r in reqs:
        w.scheduler.add_request(r)
    matched: list[int] = []
    match = w.cache.match_prefix

    def counting(key: list[int], **kw: Any) -> Any:
        end = kw.get("end")
        matched.append(len(key[:end]))  # the tokens matched
        return match(key, **kw)

    w.cache.match_prefix = counting  # type: ignore[method-assign,assignment]
    w.scheduler.step()
    assert matched == [27, 27, 27]  # the admitted three only
    run_to_completion(w)
    # Step 1: the first request of each group; the other 15 share its first 16 tokens and
    # wait without a prefix match, so the cap (on matched ones) never stops the scan.
    assert rec.steps[0] == [("g0-0", 28), ("g1-0", 28), ("g2-0", 28)]
    # Step 2: three decode rows, then every other request computes its own 4 tokens.
    assert rec.steps[1][:3] == [("g0-0", 1), ("g1-0", 1), ("g2-0", 1)]
    assert rec.steps[1][3:] == [(f"g{g}-{i}", 4) for g in range(3) for i in range(1, 6)]
    assert [r.num_cached_tokens for r in reqs] == [0, 24, 24, 24, 24, 24] * 3
    assert w.scheduler.stats().cache_hit_tokens == 15 * 24
    assert all(r.num_output_tokens == 2 for r in reqs)
    assert all_free_after_flush(w)


def _behind_a_cached_prefix(limit: int) -> list[list[tuple[str, int]]]:
    """Groups that share a cached 24-token prefix, then a new 16-token one of their own:
    their cached part is too long for the match-free path, so each deferral is matched."""
    w = make_worker(
        policy="fcfs",
        in_batch_prefix_threshold=8,
        max_num_batched_tokens=200,
        max_running_requests=32,
        admission_match_limit=limit,
    )
    common = PREFIXES[0]
    warm = make_request(w, common, rid="warm", max_new_tokens=1)
    w.scheduler.add_request(warm)
    run_to_completion(w)
    assert w.cache.total_size() == 24
    rec = Recorder().attach(w)
    for rid, group in (("a0", 1), ("a1", 1), ("a2", 1), ("b0", 2)):
        own = list(range(300 + 20 * group, 316 + 20 * group))  # 16 tokens per group
        prompt = [*common, *own, 50 + int(rid[1]), 9]
        w.scheduler.add_request(make_request(w, prompt, rid=rid, max_new_tokens=1))
    run_to_completion(w)
    assert all_free_after_flush(w)
    return rec.steps


def test_deferrals_past_the_match_limit_end_the_steps_scan() -> None:
    # Without a binding cap: a0 and b0 in the first step; a1, a2 wait and hit a0's prefix.
    assert _behind_a_cached_prefix(64) == [[("a0", 18), ("b0", 18)], [("a1", 2), ("a2", 2)]]
    # Cap 2: a1 and a2 are matched and passed over, and the scan stops before b0.
    assert _behind_a_cached_prefix(2) == [[("a0", 18)], [("a1", 2), ("a2", 2), ("b0", 18)]]


@pytest.mark.parametrize(
    ("field", "value"), [("admission_match_limit", 0), ("in_batch_prefix_threshold", 0)]
)
def test_admission_limits_are_validated(field: str, value: int) -> None:
    with pytest.raises(InvalidArgument, match=field):
        SchedulerConfig(**{field: value})  # type: ignore[arg-type]
