from __future__ import annotations

import pytest

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.router.policy import POLICIES, Candidate, PolicyOptions, make_policy


def _c(
    wid: str, cached: int = 0, queued: int = 0, healthy: bool = True, pending: int = 0
) -> Candidate:
    return Candidate(wid, healthy, cached, queued, pending)


def test_registry_names() -> None:
    assert sorted(POLICIES) == [
        "cache_aware",
        "least_load",
        "power_of_two",
        "random",
        "round_robin",
    ]
    with pytest.raises(InvalidArgument, match="policy: unknown policy 'nope'"):
        make_policy("nope")


def test_cache_aware_prefers_the_cached_prefix() -> None:
    p = make_policy("cache_aware", seed=0, options=PolicyOptions(request_cost_tokens=64))
    cands = [_c("w0", cached=0), _c("w1", cached=96), _c("w2", cached=32)]
    assert p.choose(128, cands) == "w1"


def test_cache_aware_weighs_queued_work() -> None:
    p = make_policy("cache_aware", seed=0, options=PolicyOptions(request_cost_tokens=64))
    # w1: 128 - 96 + 2 * 64 = 160 > w0: 128 - 0 + 0 = 128
    assert p.choose(128, [_c("w0"), _c("w1", cached=96, queued=2)]) == "w0"
    # w1: 32 + 64 = 96 < 128
    assert p.choose(128, [_c("w0"), _c("w1", cached=96, queued=1)]) == "w1"


def test_cache_aware_weighs_prefill_already_waiting() -> None:
    options = PolicyOptions(request_cost_tokens=64, pending_prefill_weight=0.5)
    p = make_policy("cache_aware", seed=0, options=options)
    # w1 caches the prompt but has a 4,096-token prefill waiting: 0 + 2048 + 64 = 2112,
    # against w0's cold 1,024-token prefill: 1024 + 0 + 64 = 1088.
    cands = [_c("w0", queued=1), _c("w1", cached=1024, queued=1, pending=4096)]
    assert p.choose(1024, cands) == "w0"
    # With less waiting there (1,024 tokens: 0 + 512 + 64 = 576), the cache wins.
    cands = [_c("w0", queued=1), _c("w1", cached=1024, queued=1, pending=1024)]
    assert p.choose(1024, cands) == "w1"
    # Weight 0: the waiting prefill is ignored.
    off = make_policy("cache_aware", seed=0, options=PolicyOptions(pending_prefill_weight=0))
    cands = [_c("w0", queued=1), _c("w1", cached=1024, queued=1, pending=4096)]
    assert off.choose(1024, cands) == "w1"


def test_cache_aware_skips_unhealthy_and_breaks_ties_at_random() -> None:
    p = make_policy("cache_aware", seed=1)
    cands = [_c("w0"), _c("w1"), _c("w2", cached=128, healthy=False)]
    picks = [p.choose(128, cands) for _ in range(20)]
    assert set(picks) == {"w0", "w1"}
    again = make_policy("cache_aware", seed=1)
    assert [again.choose(128, cands) for _ in range(20)] == picks


def test_round_robin_cycles_over_healthy() -> None:
    p = make_policy("round_robin")
    cands = [_c("w0"), _c("w1", healthy=False), _c("w2")]
    assert [p.choose(1, cands) for _ in range(4)] == ["w0", "w2", "w0", "w2"]


def test_least_load() -> None:
    p = make_policy("least_load", seed=0)
    assert p.choose(1, [_c("w0", queued=3), _c("w1", queued=1), _c("w2", queued=2)]) == "w1"


def test_power_of_two_takes_the_less_loaded_of_its_pair() -> None:
    p = make_policy("power_of_two", seed=3)
    cands = [_c("w0", queued=5), _c("w1", queued=0), _c("w2", queued=9)]
    picks = [p.choose(1, cands) for _ in range(30)]
    assert "w2" not in picks  # the most loaded always loses its pair
    assert set(picks) == {"w0", "w1"}


def test_random_is_seeded() -> None:
    cands = [_c("w0"), _c("w1"), _c("w2")]
    p, q = make_policy("random", seed=5), make_policy("random", seed=5)
    picks = [p.choose(1, cands) for _ in range(30)]
    assert picks == [q.choose(1, cands) for _ in range(30)]
    assert set(picks) == {"w0", "w1", "w2"}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_no_healthy_worker_is_unavailable(name: str) -> None:
    with pytest.raises(Unavailable, match="no healthy worker"):
        make_policy(name, seed=0).choose(1, [_c("w0", healthy=False)])
