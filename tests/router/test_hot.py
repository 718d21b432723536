"""Hot prefixes: more homes while a prefix's load outruns one worker, fewer as it cools."""

from __future__ import annotations

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.hot import HotPrefixConfig, HotPrefixes, HotPrefixStats


def _measured() -> HotPrefixes:
    """A worker measured finishing 10 requests a second (a whole 1 s window)."""
    hot = HotPrefixes(HotPrefixConfig(window_s=1.0, utilization=0.8, shrink_utilization=0.5))
    for i in range(11):
        hot.finished("w0", i / 10)
    assert hot.capacity_rps == 10.0
    return hot


def test_a_prefix_gains_homes_while_hot_and_loses_them_as_it_cools() -> None:
    hot = _measured()
    spare = iter(["w1", "w2", "w3"])

    def arrive(t: float) -> list[str]:
        _, grow = hot.arrived(7, t, "w0")  # cache_aware alone: w0
        if grow:
            hot.add_home(7, next(spare))
        return list(hot.homes(7))

    # 20 requests a second for a second: hot once the load passes 0.8 x 10 = 8 a second
    # (the 9th request), a third home past 16 a second (the 17th).
    peak = [arrive(1.0 + i / 20) for i in range(1, 21)]
    assert peak == [[]] * 8 + [["w0", "w1"]] * 8 + [["w0", "w1", "w2"]] * 4
    assert hot.stats == HotPrefixStats(hot=1, homes=3, replications=2, dereplications=0)
    # 2 a second: the last-added home goes once the load fits one fewer at 0.5 x 10 each.
    cool = [arrive(2.0 + i / 2) for i in range(1, 5)]
    assert cool == [["w0", "w1", "w2"], ["w0", "w1"], [], []]
    assert hot.stats == HotPrefixStats(hot=0, homes=0, replications=2, dereplications=2)


def test_nothing_is_hot_before_a_worker_was_measured_for_a_window() -> None:
    hot = HotPrefixes(HotPrefixConfig(window_s=1.0))
    hot.finished("w0", 0.0)
    hot.finished("w0", 0.5)
    assert hot.capacity_rps == 0.0
    assert [hot.arrived(7, 0.5 + i / 100, "w0") for i in range(3)] == [([], False)] * 3


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
