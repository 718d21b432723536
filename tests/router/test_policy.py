from __future__ import annotations

import pytest

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.router.policy import POLICIES, Candidate, Policy, PolicyOptions, make_policy


def _c(
    wid: str,
    cached: int = 0,
    queued: int = 0,
    healthy: bool = True,
    pending: int = 0,
    host: int = 0,
    grammar: bool = False,
) -> Candidate:
    return Candidate(wid, healthy, cached, queued, pending, host, grammar)


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


def test_cache_aware_prefers_a_host_memory_hit_to_a_miss() -> None:
    p = make_policy("cache_aware", seed=0)  # host_hit_cost 0.2
    # w1 holds 1,024 of the 1,280 prompt tokens in host memory: 256 + 0.2 x 1024 = 460.8,
    # against w0's miss: 1,280. Both run one request.
    cands = [_c("w0", queued=1), _c("w1", queued=1, host=1024)]
    assert p.choose(1280, cands) == "w1"
    # A device hit still beats the same tokens in host memory (256 against 460.8).
    assert p.choose(1280, [*cands, _c("w2", cached=1024, queued=1)]) == "w2"
    # Host hits after device ones: 1280 - 512 - 512 + 0.2 x 512 = 358.4 < 460.8.
    assert p.choose(1280, [*cands, _c("w3", cached=512, queued=1, host=512)]) == "w3"
    # Load still counts: the host hit saves 1280 - 460.8 = 819.2 tokens, so w1 keeps winning
    # with 4 more queued requests (256 tokens) and loses with 14 more (896).
    assert p.choose(1280, [_c("w0", queued=1), _c("w1", queued=5, host=1024)]) == "w1"
    assert p.choose(1280, [_c("w0", queued=1), _c("w1", queued=15, host=1024)]) == "w0"


def test_host_hit_cost_one_is_tier_blind() -> None:
    blind = make_policy("cache_aware", seed=2, options=PolicyOptions(host_hit_cost=1.0))
    cands = [_c("w0", queued=1), _c("w1", queued=1, host=1024)]
    # 1,280 each: a tie, broken at random as between two misses.
    picks = [blind.choose(1280, cands) for _ in range(20)]
    assert set(picks) == {"w0", "w1"}
    misses = [_c("w0", queued=1), _c("w1", queued=1)]
    again = make_policy("cache_aware", seed=2, options=PolicyOptions(host_hit_cost=1.0))
    assert [again.choose(1280, misses) for _ in range(20)] == picks
    # Cost 0: a host hit is as good as a device hit (both 256 + 64: a tie).
    free = make_policy("cache_aware", seed=0, options=PolicyOptions(host_hit_cost=0.0))
    both = [_c("w0", cached=1024, queued=1), _c("w1", queued=1, host=1024)]
    assert {free.choose(1280, both) for _ in range(20)} == {"w0", "w1"}


@pytest.mark.parametrize("cost", [-0.1, 1.5, float("nan")])
def test_host_hit_cost_must_lie_in_zero_to_one(cost: float) -> None:
    with pytest.raises(InvalidArgument, match=r"host_hit_cost: must be in \[0, 1\], got"):
        PolicyOptions(host_hit_cost=cost)


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


def test_cache_aware_places_cold_prompts_in_its_replicas_share() -> None:
    def policy(index: int) -> Policy:
        return make_policy("cache_aware", 0, PolicyOptions(cold_partition=(index, 2)))

    # Sorted ids w0 w1 w2 w3: replica 0's share is w0, w2; replica 1's w1, w3.
    idle = [_c("w3"), _c("w2", queued=1), _c("w1"), _c("w0", queued=2)]
    assert make_policy("cache_aware", 0).choose(128, idle) in {"w1", "w3"}  # one router
    p0, p1 = policy(0), policy(1)
    assert p0.choose(128, idle) == "w2"  # w2 (192) beats w0 (256); w1 and w3 not its own
    assert p1.choose(128, idle) in {"w1", "w3"}
    # A worker caching some of the prompt is a choice for every replica.
    warm = [_c("w3"), _c("w2", queued=1), _c("w1", cached=96), _c("w0", queued=2)]
    assert p0.choose(128, warm) == "w1"
    # No healthy worker in its share: the others are (at the same margin each).
    down = [_c("w3"), _c("w2", healthy=False), _c("w1", queued=1), _c("w0", healthy=False)]
    assert p0.choose(128, down) == "w3"
    with pytest.raises(InvalidArgument, match="cold_partition"):
        PolicyOptions(cold_partition=(2, 2))


def test_a_cold_prompt_leaves_the_share_only_for_a_worker_idler_by_a_prefill() -> None:
    # Replica 0 of 2 owns w0 and w2 (sorted ids); a 128-token prompt that a worker caches
    # none of costs 128 more on w1 or w3. Costs: 128 + 64 a queued request + 0.5 a
    # pending token (+ 128 off the share).
    p = make_policy("cache_aware", 0, PolicyOptions(cold_partition=(0, 2)))
    # w0 192, w2 256, w1 and w3 256 (one router: 128, its pick).
    assert p.choose(128, [_c("w0", queued=1), _c("w1"), _c("w2", queued=2), _c("w3")]) == "w0"
    # w0 and w2 320, w1 256, w3 320: the whole share is busier than w1 by more than one
    # prefill of the prompt, so w1.
    busy = [_c("w0", queued=3), _c("w1"), _c("w2", queued=3), _c("w3", queued=1)]
    assert p.choose(128, busy) == "w1"
    # w1's 160 pending tokens make it 336 against w0's 320, w2 384, w3 384: w0.
    pending = [_c("w0", queued=3), _c("w1", pending=160), _c("w2", queued=4), _c("w3", queued=2)]
    assert p.choose(128, pending) == "w0"
    # A warm prompt spilling off its holder (w3 caches 96 tokens: 32 + 4 queued = 288) goes
    # to the share (w0 192), not to the idle w1 (256 off the share).
    warm = [_c("w0", queued=1), _c("w1"), _c("w2", queued=3), _c("w3", cached=96, queued=4)]
    assert p.choose(128, warm) == "w0"
    # 0: no margin, the replica chooses among every worker as one router does.
    free = make_policy("cache_aware", 0, PolicyOptions(cold_partition=(0, 2), off_share_prefills=0))
    assert free.choose(128, busy) == "w1"
    assert (
        free.choose(128, [_c("w0", queued=1), _c("w1"), _c("w2", queued=1), _c("w3", queued=1)])
        == "w1"
    )
    for bad in (-1.0, float("inf")):
        with pytest.raises(InvalidArgument, match="off_share_prefills"):
            PolicyOptions(off_share_prefills=bad)


def test_grammar_affinity_breaks_ties_for_the_worker_holding_the_grammar() -> None:
    # Equal costs (a cold prompt, idle workers): the holder wins every draw of every seed.
    for seed in range(20):
        p = make_policy("cache_aware", seed)
        cands = [_c("w0"), _c("w1", grammar=True), _c("w2"), _c("w3")]
        assert p.choose(100, cands) == "w1"


def test_grammar_affinity_decides_near_ties_only() -> None:
    p = make_policy("cache_aware", 0, PolicyOptions(grammar_affinity_tokens=32))
    # w0 caches 16 more prompt tokens (cost 84 against 100 - 32 = 68): the grammar wins.
    assert p.choose(100, [_c("w0", cached=16), _c("w1", grammar=True)]) == "w1"
    # 48 more (52 against 68): the cache wins.
    assert p.choose(100, [_c("w0", cached=48), _c("w1", grammar=True)]) == "w0"
    # One more queued request there (64 > 32): the idle worker wins.
    assert p.choose(100, [_c("w0"), _c("w1", queued=1, grammar=True)]) == "w0"


def test_grammar_affinity_zero_is_off() -> None:
    p = make_policy("cache_aware", 3, PolicyOptions(grammar_affinity_tokens=0))
    chosen = {p.choose(100, [_c("w0"), _c("w1", grammar=True)]) for _ in range(40)}
    assert chosen == {"w0", "w1"}
    with pytest.raises(InvalidArgument, match="grammar_affinity_tokens"):
        PolicyOptions(grammar_affinity_tokens=-1)


def test_a_grammar_holder_outside_the_replicas_share_takes_a_cold_prompt() -> None:
    # Replica 0 of 2 owns w0 and w2; w1 holds the grammar and wins the cold prompt.
    p = make_policy("cache_aware", 0, PolicyOptions(cold_partition=(0, 2)))
    cands = [_c("w0"), _c("w1", grammar=True), _c("w2"), _c("w3")]
    assert p.choose(100, cands) == "w1"
    # Without it, the cold prompt stays in the share.
    assert p.choose(100, [_c("w0"), _c("w1"), _c("w2"), _c("w3")]) in ("w0", "w2")
