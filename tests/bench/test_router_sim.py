"""The router simulator on tiny seeded traces: fast and exact."""

from __future__ import annotations

import random
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


def test_partitioned_replicas_place_cold_prompts_in_their_shares() -> None:
    config = sim.SimConfig(workers=4, seed=0, replicas=4, partition_cold=True)
    observe = sim.Observation()
    sim.simulate(_burst(), "cache_aware", config, observe)
    # Replica r's share of 4 workers is worker-r alone: each places the (to it) new prefix
    # there, and keeps to it (its own tentative entries).
    assert observe.replica_of == [3, 0, 1, 2, 3, 0, 1, 2]
    assert observe.placements == observe.replica_of


def test_replicas_same_seed_same_figures() -> None:
    config = replace(_config(), replicas=4, sharing="worker-announced")
    first, again = sim.Observation(), sim.Observation()
    figures = sim.simulate(_tiny_grouped(), "cache_aware", config, first)
    assert sim.simulate(_tiny_grouped(), "cache_aware", config, again) == figures
    assert (again.placements, again.replica_of) == (first.placements, first.replica_of)
    assert len(first.route_us) == 4 and sum(map(len, first.route_us)) == 72
    other = replace(config, seed=1)
    assert sim.simulate(_tiny_grouped(seed=1), "cache_aware", other) != figures


def test_shared_load_counts_the_other_replicas_requests() -> None:
    config = sim.SimConfig(workers=2, replicas=2, load_sharing="worker-announced")
    workers = [sim.SimWorker(i, config) for i in range(2)]
    router = sim.SimRouter("cache_aware", workers, config, sim.SimClock(), random.Random(0))
    cold = _request(0, 0.0, _prefix(0, 256))  # 16 blocks, none in the summary
    warm = _request(1, 0.0, _prefix(1, 256))
    router.apply("worker-1", "stored", warm.prompt_hashes[:12])  # 4 blocks missing
    router.announced(workers[0], cold)
    router.announced(workers[1], warm)
    view = [(c.queued, c.pending_prefill) for c in router.idle]
    assert view == [(1, 64), (1, 16)]  # 0.25 x 256 and 0.25 x 64 tokens
    router.started_elsewhere(workers[0], 0)
    router.started_elsewhere(workers[0], 0)  # (once only)
    assert [(c.queued, c.pending_prefill) for c in router.idle] == [(1, 0), (1, 16)]
    router.ended_elsewhere(workers[0], 0)
    router.ended_elsewhere(workers[1], 1)  # ended before it started: its estimate goes too
    assert [(c.queued, c.pending_prefill) for c in router.idle] == [(0, 0), (0, 0)]
    # Its own requests count from its decision on (the others' events name only theirs).
    assert router.route(_request(2, 0.0, _prefix(2, 256))) is workers[1]
    assert [(c.queued, c.pending_prefill) for c in router.idle] == [(0, 0), (1, 256)]


def test_replica_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="replicas"):
        sim.SimConfig(workers=4, replicas=0)
    with pytest.raises(ValueError, match="sharing"):
        sim.SimConfig(workers=4, sharing="gossip")
    with pytest.raises(ValueError, match="load_sharing"):
        sim.SimConfig(workers=4, load_sharing="gossip")
    with pytest.raises(ValueError, match="shared_pending_weight"):
        sim.SimConfig(workers=4, shared_pending_weight=1.5)


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


# ---- host-memory tiers ------------------------------------------------------------------


def _serve(w: sim.SimWorker, req: sim.Request, outcomes: list[sim.Outcome]) -> list:
    """Run one request to its end on an idle worker; the events it published."""
    events: list[tuple[str, list[int]]] = []
    w.enqueue(req)
    w.start_step(outcomes, events)
    while w.running or w.prefilling:
        w.end_step(0.0, outcomes, events)
    return events


def test_host_tier_keeps_evicted_blocks_reloads_them_and_drops_lru() -> None:
    # A 4-block KV cache over a 2-block host tier; 3-block prompts, one output token.
    config = sim.SimConfig(workers=1, capacity_tokens=64, host_capacity_tokens=32)
    w = sim.SimWorker(0, config)
    reqs = [_request(rid, 0.0, _prefix(g, 48), output_len=1) for rid, g in enumerate([0, 1, 0, 2])]
    a, b, c = reqs[0].prompt_hashes, reqs[1].prompt_hashes, reqs[3].prompt_hashes
    outcomes = [sim.Outcome() for _ in reqs]
    assert _serve(w, reqs[0], outcomes) == [("stored", a)]
    # b needs 2 of a's blocks: its leaf first, to host memory.
    assert _serve(w, reqs[1], outcomes) == [("offloaded", [a[2], a[1]]), ("stored", b)]
    assert list(w.host.blocks) == [a[2], a[1]]
    # a again: block 0 on the device, blocks 1-2 reloaded (b's two deepest go to host).
    events: list[tuple[str, list[int]]] = []
    w.enqueue(reqs[2])
    duration = w.start_step(outcomes, events)
    assert events == [("offloaded", [b[2], b[1]]), ("loaded", [a[1], a[2]])]
    assert (outcomes[2].cached_tokens, outcomes[2].host_cached_tokens) == (16, 32)
    cost = config.cost
    assert duration == cost.step_s + cost.reload_token_s * 32  # nothing prefilled
    w.end_step(0.0, outcomes, events)
    # c evicts b's root and a's two deepest blocks; the host tier keeps the newest two.
    assert _serve(w, reqs[3], outcomes) == [
        ("offloaded", [b[0], a[2], a[1]]),
        ("removed", [b[2], b[1], b[0]]),
        ("stored", c),
    ]
    assert list(w.host.blocks) == [a[2], a[1]] and w.will_reload(a, 1) == 2


def test_without_a_host_tier_evicted_blocks_are_removed() -> None:
    w = sim.SimWorker(0, sim.SimConfig(workers=1, capacity_tokens=64))
    reqs = [_request(rid, 0.0, _prefix(g, 48), output_len=1) for rid, g in enumerate([0, 1, 0])]
    a, b = reqs[0].prompt_hashes, reqs[1].prompt_hashes
    outcomes = [sim.Outcome() for _ in reqs]
    _serve(w, reqs[0], outcomes)
    assert _serve(w, reqs[1], outcomes) == [("removed", [a[2], a[1]]), ("stored", b)]
    assert _serve(w, reqs[2], outcomes) == [("removed", [b[2], b[1]]), ("stored", a[1:])]
    assert (outcomes[2].cached_tokens, outcomes[2].host_cached_tokens) == (16, 0)


def test_the_simulated_router_keeps_tiered_summaries() -> None:
    config = sim.SimConfig(workers=2, host_capacity_tokens=1024)
    workers = [sim.SimWorker(i, config) for i in range(2)]
    router = sim.SimRouter("cache_aware", workers, config, sim.SimClock(), random.Random(0))
    req = _request(0, 0.0, _prefix(0, 64))
    h = req.prompt_hashes
    router.apply("worker-1", "stored", h)
    router.apply("worker-1", "offloaded", h[1:])
    router.apply("worker-0", "stored", h[:1])
    assert router.index.match_tiers(h) == {"worker-0": (1, 0), "worker-1": (1, 3)}
    # worker-1's host hits: 64 - 16 - 48 + 0.2 x 48 = 9.6 against worker-0's 48.
    assert router.route(req) is workers[1]
    assert router.pending == [0, 0]  # nothing for worker-1 to prefill: reloads only
    # The prompt counts as tentatively on worker-1's device now: 4 device blocks.
    assert router.index.match_tiers(h)["worker-1"] == (4, 0)
    router.apply("worker-1", "loaded", h[1:2])
    router.apply("worker-1", "removed", h[3:])
    s = router.index["worker-1"]
    assert (s.num_confirmed, s.num_host) == (2, 1)  # blocks 0-1 confirmed; block 2 in host


def test_tier_aware_routing_against_tier_blind() -> None:
    rows = router_sim.tier_rows(workers=4, rates=[20.0], seed=0)
    trace = sim.grouped_trace(4, 0, groups_per_worker=router_sim.TIER_GROUPS_PER_WORKER)
    prompt = sum(r.prompt_len for r in trace)
    assert (len(trace), prompt) == (1152, 2433024)

    def tokens(r: dict) -> tuple[int, int]:  # (device hits, host hits) in prompt tokens
        return round(r["hit_rate"] * prompt), round(r["host_hit_rate"] * prompt)

    got = {r["router"]: (r["host_capacity_tokens"], r["host_hit_cost"], *tokens(r)) for r in rows}
    assert got == {
        "no host tier": (0, 0.2, 1373856, 0),
        "tier-blind": (32768, 1.0, 1651856, 228992),
        "tier-aware": (32768, 0.2, 1652736, 604160),
        "oracle": (32768, 0.2, 1708048, 552944),
    }
    # What no router avoids: 1,152 questions of 64 tokens and 48 first 2,048-token prefixes.
    assert {round(r["ideal_miss_rate"] * prompt) for r in rows} == {1152 * 64 + 48 * 2048}
    aware, blind = rows[2], rows[1]
    assert aware["miss_rate"] < blind["miss_rate"] / 2


def test_host_tier_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="host_capacity_tokens"):
        sim.SimConfig(workers=1, host_capacity_tokens=-16)
    with pytest.raises(ValueError, match="host_hit_cost"):
        sim.SimConfig(workers=1, host_hit_cost=2.0)


def test_the_hot_prefix_trace_gives_one_prefix_sixty_percent_at_the_length_asked() -> None:
    # Seeded: the hot prefix's requests of 384, drawn at 60% each.
    for prefix_len, hot in ((2048, 240), (8192, 234)):
        trace = sim.hot_prefix_trace(2, 0, rate_per_worker=10.0, prefix_len=prefix_len)
        assert len(trace) == 2 * 4 * 48  # 4 groups a worker, 48 requests a group
        assert {r.prompt_len for r in trace} == {prefix_len + 64}
        assert {r.output_len for r in trace} == {128}
        key = prefix_len // 16 - 1  # the prefix's last block
        counts: dict[int, int] = {}
        for r in trace:
            counts[r.prompt_hashes[key]] = counts.get(r.prompt_hashes[key], 0) + 1
        assert len(counts) == 8
        assert max(counts.values()) == hot
