"""The router simulator on tiny seeded traces: fast and exact."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench import router_sim, sim
from radixmesh.prefix import block_hashes


def _tiny_grouped(seed: int = 0) -> list[sim.Request]:  # 4 workers x 3 groups x 6 requests = 72
    return sim.grouped_trace(4, seed, groups_per_worker=3, requests_per_group=6)


def _config(seed: int = 0) -> sim.SimConfig:
    # 4 workers caching 4,096 tokens each: 12 groups of 2,048-token prefixes need 6 caches.
    return sim.SimConfig(workers=4, capacity_tokens=4096, seed=seed)


@pytest.fixture(scope="module")
def grouped() -> dict[str, dict]:
    trace = _tiny_grouped()
    return {p: sim.simulate(trace, p, _config()) for p in ("round_robin", "cache_aware", "oracle")}


def test_block_cache_evicts_leaves_first_and_never_pinned() -> None:
    cache = sim.BlockCache(capacity_blocks=4)
    a = block_hashes(list(range(12)), 4)  # a path of 3 blocks
    b = block_hashes([99, 98, 97, 96], 4)  # one unrelated block
    assert cache.insert(a, pin=True) == (a, [])
    assert cache.insert(b, pin=False) == (b, [])
    assert cache.match(a) == 3 and len(cache) == 4
    c = block_hashes([7, 7, 7, 7], 4)
    assert cache.insert(c, pin=False) == (c, b)  # a is pinned: b goes
    cache.unpin(a)
    d = block_hashes([5, 5, 5, 5, 6, 6, 6, 6], 4)
    # LRU order now: a's leaf, a's middle, a's root, c. Two slots are needed: leaf, middle.
    assert cache.insert(d, pin=False) == (d, [a[2], a[1]])
    assert cache.match(a) == 1
    assert cache.insert(block_hashes(list(range(40)), 4), pin=True) is None  # 10 > 4 blocks


def test_grouped_trace_orders_policies(grouped: dict[str, dict]) -> None:
    rr, ca, oracle = grouped["round_robin"], grouped["cache_aware"], grouped["oracle"]
    assert rr["requests"] == ca["requests"] == oracle["requests"] == 72
    assert oracle["hit_rate"] >= ca["hit_rate"] > rr["hit_rate"]
    assert ca["hit_rate"] > 2 * rr["hit_rate"]
    assert ca["throughput_rps"] > rr["throughput_rps"]
    assert ca["ttft_p99_s"] < rr["ttft_p99_s"]
    # 12 groups can hit at most 1 - 12 first misses of 72 ... of their 2,048 prefix tokens.
    assert ca["hit_rate"] <= (72 - 12) / 72 * 2048 / 2112
    assert rr["max_worker_share"] == 18 / 72  # round robin: exactly even


def test_same_seed_same_figures_other_seed_others(grouped: dict[str, dict]) -> None:
    again = sim.simulate(_tiny_grouped(), "cache_aware", _config())
    assert again == grouped["cache_aware"]
    other = sim.simulate(_tiny_grouped(seed=1), "cache_aware", _config(seed=1))
    assert other != grouped["cache_aware"]


def test_noshare_control_caches_nothing() -> None:
    trace = sim.noshare_trace(2, 0, requests_per_worker=8, prompt_len=256, output_len=4)
    config = sim.SimConfig(workers=2, seed=0)
    for policy in ("cache_aware", "round_robin"):
        figures = sim.simulate(trace, policy, config)
        assert figures["hit_rate"] == 0.0
        assert figures["requests"] == 16


def test_multiturn_later_turns_hit_their_history() -> None:
    trace = sim.multiturn_trace(2, 0, chats_per_worker=2, turns=3, output_len=8)
    assert [r.after for r in trace[:3]] == [None, 0, 1]
    # A turn's prompt is the previous turn's prompt + answer + a message: chained hashes.
    assert trace[1].prompt_hashes[: len(trace[0].full_hashes)] == trace[0].full_hashes
    config = sim.SimConfig(workers=2, seed=0)
    ca = sim.simulate(trace, "cache_aware", config)
    rr = sim.simulate(trace, "round_robin", config)
    assert ca["hit_rate"] > rr["hit_rate"]


def test_decision_latency_and_memory_run_small() -> None:
    lat = router_sim.decision_latency(
        workers=4, blocks_per_worker=100, decisions=20, rounds=1, prompt_len=256, shared_len=128
    )
    assert lat["rounds"][0]["chose_a_holder"] == 1.0  # the holders cache 128 of 256 tokens
    assert lat["p50_us"] > 0
    mem = router_sim.summary_memory(workers=2, blocks_per_worker=1000)
    assert mem["blocks"] == 2000
    assert 40 < mem["bytes_per_block"] < 200


# ---- router replicas --------------------------------------------------------------------


def _request(rid: int, arrival: float, prompt: list[int], output_len: int = 4) -> sim.Request:
    answer = [rid % sim.VOCAB] * output_len
    full = block_hashes(prompt + answer, 16)
    return sim.Request(rid, arrival, len(prompt), output_len, full[: len(prompt) // 16], full)


def _prefix(group: int, n: int) -> list[int]:
    return [(group * 7919 + i) % sim.VOCAB for i in range(n)]


def _placements(trace: list[sim.Request], config: sim.SimConfig) -> list[int]:
    observe = sim.Observation()
    sim.simulate(trace, "cache_aware", config, observe)
    return observe.placements


def test_one_replica_routes_as_the_single_router(grouped: dict[str, dict]) -> None:
    ca = grouped["cache_aware"]
    # The single router's figures before replicas were modelled, on this trace and config.
    prompt_tokens = sum(r.prompt_len for r in _tiny_grouped())
    assert prompt_tokens == 152064
    assert round(ca["hit_rate"] * prompt_tokens) == 81888
    assert ca["max_worker_share"] == 22 / 72 and ca["summary_blocks"] == 1024
    assert _placements(_tiny_grouped(), _config()) == [
        3, 1, 0, 3, 2, 1, 2, 2, 0, 2, 3, 1, 2, 2, 3, 3, 3, 1, 0, 2, 3, 2, 1, 3,
        1, 0, 0, 2, 0, 0, 3, 2, 1, 2, 2, 1, 0, 0, 2, 2, 3, 2, 0, 2, 3, 1, 0, 2,
        0, 0, 1, 1, 3, 3, 3, 2, 1, 1, 1, 1, 2, 0, 3, 3, 3, 0, 2, 2, 0, 0, 2, 3,
    ]  # fmt: skip
    # With one replica there is nobody to share with: `owner` is the single router too.
    owner = replace(_config(), sharing="owner")
    assert sim.simulate(_tiny_grouped(), "cache_aware", owner) == ca


def test_worker_announced_without_delay_places_as_one_router() -> None:
    # 12 requests one at a time over 3 prefixes, each finished before the next arrives and
    # between the load polls (which then see idle workers).
    trace = [
        _request(rid, 0.2 + 0.5 * rid, _prefix(rid % 3, 256) + _prefix(100 + rid, 32))
        for rid in range(12)
    ]
    one = sim.SimConfig(workers=4, event_delay_s=0.0, seed=0)
    placements = _placements(trace, one)
    assert [placements[g::3].count(placements[g]) for g in range(3)] == [4, 4, 4]
    assert len(set(placements)) > 1
    two = replace(one, replicas=2, sharing="worker-announced")
    assert _placements(trace, two) == placements


def _burst() -> list[sim.Request]:
    """8 requests sharing a 2,048-token prefix, all within 1 ms (under the event delay)."""
    return [_request(rid, 1e-4 * rid, _prefix(0, 2048) + _prefix(1 + rid, 64)) for rid in range(8)]


def test_local_replicas_scatter_a_burst_of_one_prefix() -> None:
    config = sim.SimConfig(workers=4, seed=0)
    assert _placements(_burst(), config) == [3] * 8  # one router: its tentative entries
    observe = sim.Observation()
    sim.simulate(_burst(), "cache_aware", replace(config, replicas=4), observe)
    placed = observe.placements
    # Each replica sees the prefix first, places it on its own, then keeps to its choice.
    assert observe.replica_of == [3, 0, 1, 2, 3, 0, 1, 2]
    assert placed == [3, 1, 0, 2, 3, 1, 0, 2]  # 4 copies of the prefix instead of 1
    # The worker-announced pending event arrives only after the burst (5 ms): the same.
    announced = replace(config, replicas=4, sharing="worker-announced")
    assert _placements(_burst(), announced) == placed
    # One owner per prefix: every request is routed by the same replica, as by one router.
    owner = replace(config, replicas=4, sharing="owner")
    assert _placements(_burst(), owner) == [3] * 8


def test_replicas_same_seed_same_figures() -> None:
    config = replace(_config(), replicas=4, sharing="worker-announced")
    first, again = sim.Observation(), sim.Observation()
    figures = sim.simulate(_tiny_grouped(), "cache_aware", config, first)
    assert sim.simulate(_tiny_grouped(), "cache_aware", config, again) == figures
    assert (again.placements, again.replica_of) == (first.placements, first.replica_of)
    assert len(first.route_us) == 4 and sum(map(len, first.route_us)) == 72
    other = replace(config, seed=1)
    assert sim.simulate(_tiny_grouped(seed=1), "cache_aware", other) != figures


def test_replica_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="replicas"):
        sim.SimConfig(workers=4, replicas=0)
    with pytest.raises(ValueError, match="sharing"):
        sim.SimConfig(workers=4, sharing="gossip")


def test_replica_rows_compare_with_one_router() -> None:
    rows = router_sim.replica_rows([2], ["grouped"], [1, 2], ["local", "owner"], seed=0)
    assert [(r["policy"], r["replicas"], r["sharing"]) for r in rows] == [
        ("cache_aware", 1, "one router"),
        ("cache_aware", 2, "local"),
        ("cache_aware", 2, "owner"),
        ("oracle", 1, "one router"),
    ]
    assert rows[0]["hit_rate_vs_one"] == 1.0
    assert rows[1]["hit_rate_vs_one"] == rows[1]["hit_rate"] / rows[0]["hit_rate"]
    assert all(r["requests"] == 192 and 0 < r["route_p50_us"] <= r["route_p99_us"] for r in rows)
    assert len(rows[1]["route_p99_us_by_replica"]) == 2
