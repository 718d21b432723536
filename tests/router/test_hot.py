"""Hot prefixes: a prefix hot while its load outruns one worker, its homes added where a copy
is cheaper and dropped as it cools."""

from __future__ import annotations

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.hot import HotPrefixConfig, HotPrefixes, HotPrefixStats, place
from radixmesh.router.policy import Candidate, make_policy


def _measured() -> HotPrefixes:
    """A worker measured finishing 10 requests a second (a whole 1 s window)."""
    hot = HotPrefixes(HotPrefixConfig(window_s=1.0, utilization=0.8, shrink_utilization=0.5))
    for i in range(11):
        hot.finished("w0", i / 10)
    assert hot.capacity_rps == 10.0
    return hot


def test_a_prefix_is_hot_while_its_load_outruns_a_worker_and_loses_homes_as_it_cools() -> None:
    hot = _measured()

    def arrive(t: float) -> list[str]:
        return list(hot.arrived(7, t, "w0"))  # cache_aware alone: w0

    # 20 requests a second for a second: hot once the load passes 0.8 x 10 = 8 a second
    # (the 9th request), cache_aware's pick its first home.
    peak = [arrive(1.0 + i / 20) for i in range(1, 21)]
    assert peak == [[]] * 8 + [["w0"]] * 12
    assert hot.stats == HotPrefixStats(hot=0, homes=0, replications=0, dereplications=0)
    hot.add_home(7, "w1")
    hot.add_home(7, "w2")
    hot.add_home(7, "w2")  # (already one)
    assert hot.stats == HotPrefixStats(hot=1, homes=3, replications=2, dereplications=0)
    # 2 a second: the last-added home goes once the load fits one fewer at 0.5 x 10 each;
    # with two left, one more fewer is none.
    cool = [arrive(2.0 + i / 2) for i in range(1, 5)]
    assert cool == [["w0", "w1", "w2"], ["w0", "w1"], [], []]
    assert hot.stats == HotPrefixStats(hot=0, homes=0, replications=2, dereplications=2)


def test_nothing_is_hot_before_a_worker_was_measured_for_a_window() -> None:
    hot = HotPrefixes(HotPrefixConfig(window_s=1.0))
    hot.finished("w0", 0.0)
    hot.finished("w0", 0.5)
    assert hot.capacity_rps == 0.0
    assert [hot.arrived(7, 0.5 + i / 100, "w0") for i in range(3)] == [[]] * 3


def test_a_prefix_that_stops_cools_on_other_arrivals_and_a_gone_worker_is_no_home() -> None:
    hot = _measured()
    for i in range(1, 10):
        hot.arrived(7, 1.0 + i / 20, "w0")
    hot.add_home(7, "w1")
    assert hot.homes(7) == ["w0", "w1"]
    hot.arrived(8, 5.0, "w3")  # (another prefix) 7 had no request for 4 s
    assert hot.homes(7) == [] and hot.stats.hot == 0
    for i in range(1, 10):
        hot.arrived(9, 6.0 + i / 20, "w0")
    hot.add_home(9, "w2")
    hot.forget_worker("w2")
    assert hot.homes(9) == [] and hot.stats == HotPrefixStats(0, 0, 2, 1)


def test_prefix_keys_and_settings() -> None:
    hot = HotPrefixes(HotPrefixConfig(key_blocks=2))
    assert (hot.key([5, 6, 7]), hot.key([5]), hot.key([])) == (6, 5, None)
    with pytest.raises(InvalidArgument, match="shrink_utilization"):
        HotPrefixConfig(utilization=0.5, shrink_utilization=0.6)
    with pytest.raises(InvalidArgument, match="window_s"):
        HotPrefixConfig(window_s=0)


def _hot_prefix(**config: float) -> HotPrefixes:
    """Prefix 7 hot (9 requests within a second against a capacity of 10 a second), w0 its
    first home."""
    hot = HotPrefixes(HotPrefixConfig(window_s=1.0, **config))  # type: ignore[arg-type]
    for i in range(11):
        hot.finished("w0", i / 10)
    for i in range(1, 9):
        assert hot.arrived(7, 1.0 + i / 20, "w0") == []
    return hot


def test_a_hot_prefix_takes_a_new_home_where_half_a_prefill_is_cheaper() -> None:
    # A 1,024-token prompt that w0 caches; w1 and w2 cache none of it. A non-home counts as
    # prefilling half of it (512); cache_aware alone would count 1,024.
    policy = make_policy("cache_aware", 0)

    def cands(q0: int, q1: int = 0, cached1: int = 0) -> list[Candidate]:
        return [
            Candidate("w0", True, 1024, q0),
            Candidate("w1", True, cached1, q1),
            Candidate("w2", True, 0, 1),
        ]

    hot = _hot_prefix()
    # w0 with 7 queued (448) against w1's 512: w0 (the 9th request makes the prefix hot).
    assert place(hot, policy, 7, 1.45, 1024, cands(7), "w0") == "w0"
    assert hot.homes(7) == ["w0"]
    # 9 queued (576): w1 (512) becomes a home, where cache_aware alone keeps w0 to 16.
    assert place(hot, policy, 7, 1.5, 1024, cands(9), "w0") == "w1"
    assert hot.homes(7) == ["w0", "w1"]
    # A home counts as caching the whole prompt: w1 with 8 queued (512) against w0's 576.
    assert place(hot, policy, 7, 1.55, 1024, cands(9, q1=8), "w0") == "w1"
    # What a non-home caches already counts in full: w2's half of 1,024 - 512 is 256 +
    # 64, below both homes (w0 576, w1 640).
    mixed = [
        Candidate("w0", True, 1024, 9),
        Candidate("w1", True, 0, 10),
        Candidate("w2", True, 512, 1),
    ]
    assert place(hot, policy, 7, 1.6, 1024, mixed, "w0") == "w2"
    assert hot.homes(7) == ["w0", "w1", "w2"]
    assert hot.stats == HotPrefixStats(hot=1, homes=3, replications=2, dereplications=0)


def test_a_hot_prefix_at_its_most_homes_stays_on_them_and_a_cold_one_keeps_the_pick() -> None:
    policy = make_policy("cache_aware", 0)
    busy = [Candidate("w0", True, 1024, 20), Candidate("w1", True, 0, 0)]
    hot = _hot_prefix(max_homes=1)
    assert place(hot, policy, 7, 1.45, 1024, busy, "w0") == "w0"  # no room for a home
    # Prefix 8 is not hot: cache_aware's pick stands, whatever it is.
    assert place(hot, policy, 8, 1.5, 1024, busy, "w1") == "w1"
    # new_home_prefill 1.0: a non-home costs what cache_aware counts (1,024 against 20
    # queued on w0: 1,280), so the same worker as cache_aware alone.
    full = _hot_prefix(new_home_prefill=1.0)
    assert place(full, policy, 7, 1.45, 1024, busy, "w0") == "w1"
    with pytest.raises(InvalidArgument, match="new_home_prefill"):
        HotPrefixConfig(new_home_prefill=1.5)
