"""The router simulator's benchmark: policies on seeded traces, and the real router's
decision latency and summary memory (the simulator: `bench/sim/`).

Figures per trace x workers x policy: hit rate (cached prompt tokens / prompt tokens, from
the workers' true caches), throughput (finished requests / makespan), time to first token
p50 / p99. Then, apart: cache_aware by `request_cost_tokens`, and a what-if (not a
registered policy) that also weighs the prefill tokens routed to a worker and not yet
started. Then the routing decision latency at 64 workers holding 100k blocks each and
the summaries' bytes per cached block (tracemalloc). Then cache_aware behind several
router replicas (`--replicas`, `--sharing`: how they learn each other's placements), its
hit rate against one router's, and worker-announced sharing by event delay. Then workers
with a host-memory KV tier: cache_aware weighing host hits (tier-aware) against counting
them as misses (tier-blind), device and host hit rates.

Run: `.venv/bin/python -m bench.router_sim` (a few minutes); `--quick` for a small run;
`--section` with one or more of sim, latency, memory, replicas, tiers for those parts only
(written to `router_sim-<parts>-<machine>.json`, leaving a full run's file alone).
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from bench import record
from bench.sim import (
    ABLATIONS,
    LOAD_SHARING,
    ORACLE,
    SHARING,
    TRACES,
    CostModel,
    Observation,
    Request,
    SimConfig,
    grouped_trace,
    hot_prefix_trace,
    percentile,
    random_tokens,
    simulate,
)
from radixmesh.prefix import block_hashes
from radixmesh.router.policy import POLICIES, Candidate, make_policy
from radixmesh.router.summary import BYTES_PER_BLOCK, SummaryIndex

# ---- routing decision latency and summary memory ----------------------------------------


def decision_latency(
    workers: int = 64,
    blocks_per_worker: int = 100_000,
    prompt_len: int = 2048,
    shared_len: int = 1536,
    holders: int = 2,
    decisions: int = 2000,
    rounds: int = 3,
    block_size: int = 16,
    seed: int = 0,
) -> dict[str, Any]:
    """p50 / p99 of one full routing decision (what `ControlPlane.pick` does).

    Every summary holds `blocks_per_worker` blocks; `holders` workers also hold a shared
    `shared_len`-token system prompt. Each decision routes a new prompt (the system prompt
    + its own tokens): hash it, match all summaries, build candidates, choose (cache_aware),
    add the prompt as tentative on the chosen worker. `rounds` rounds of `decisions`
    decisions; on a shared machine other processes only ever add time, so the round with
    the lowest p99 is the headline and every round is kept. Wall time (perf_counter) per
    part, and the whole decision's thread CPU time too (immune to preemption).
    """
    rng = random.Random(seed)
    index = SummaryIndex(1 << 40)
    for i in range(workers):
        index.add(f"worker-{i}").store(rng.getrandbits(64) for _ in range(blocks_per_worker))
    system = random_tokens(rng, shared_len)
    for i in range(holders):
        index[f"worker-{i}"].store(block_hashes(system, block_size))
    policy = make_policy("cache_aware", seed)
    queued = {f"worker-{i}": rng.randrange(8) for i in range(workers)}
    holder_ids = {f"worker-{i}" for i in range(holders)}
    last = {wid: Candidate(wid, True, 0, q) for wid, q in queued.items()}
    per_round = []
    for _ in range(rounds):
        prompts = [system + random_tokens(rng, prompt_len - shared_len) for _ in range(decisions)]
        parts: dict[str, list[float]] = {
            "total": [],
            "hash": [],
            "match": [],
            "choose": [],
            "total_cpu": [],
        }
        chosen_holder = 0
        for ids in prompts:
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            hashes = block_hashes(ids, block_size)
            t1 = time.perf_counter_ns()
            matched = index.match(hashes)
            t2 = time.perf_counter_ns()
            # As `WorkerHandle.candidate`: a worker's last Candidate is reused while it is
            # unchanged (most workers, most requests), which halves building 64 of them.
            candidates = []
            for wid, n in matched.items():
                c = last[wid]
                if c.cached_tokens != n * block_size or c.queued != queued[wid] or not c.healthy:
                    c = last[wid] = Candidate(wid, True, n * block_size, queued[wid])
                candidates.append(c)
            wid = policy.choose(len(ids), candidates)
            index[wid].add_tentative(hashes, 5.0)
            t3 = time.perf_counter_ns()
            parts["total_cpu"].append((time.thread_time_ns() - c0) / 1e3)
            for key, ns in (("total", t3 - t0), ("hash", t1 - t0), ("match", t2 - t1)):
                parts[key].append(ns / 1e3)
            parts["choose"].append((t3 - t2) / 1e3)
            chosen_holder += wid in holder_ids
        per_round.append(
            {
                **{f"{k}_p50_us": percentile(v, 50) for k, v in parts.items()},
                **{f"{k}_p99_us": percentile(v, 99) for k, v in parts.items()},
                "chose_a_holder": chosen_holder / decisions,
            }
        )
    best = min(per_round, key=lambda r: r["total_p99_us"])
    return {
        "workers": workers,
        "blocks_per_worker": blocks_per_worker,
        "prompt_len": prompt_len,
        "block_size": block_size,
        "decisions_per_round": decisions,
        "p50_us": best["total_p50_us"],
        "p99_us": best["total_p99_us"],
        # The same decisions in thread CPU time: what is left without preemption by the
        # other processes of a shared machine.
        "cpu_p50_us": best["total_cpu_p50_us"],
        "cpu_p99_us": best["total_cpu_p99_us"],
        "rounds": per_round,
    }


def summary_memory(workers: int = 64, blocks_per_worker: int = 100_000, seed: int = 0) -> dict:
    """Bytes per cached block of the summaries, measured with tracemalloc.

    The hashes are made inside the measurement: in the router they are ints the event
    stream delivers and the summary alone keeps alive, so their objects count.
    """
    rng = random.Random(seed)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = SummaryIndex(1 << 40)
        for i in range(workers):
            index.add(f"worker-{i}").store(rng.getrandbits(64) for _ in range(blocks_per_worker))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    blocks = sum(len(s) for s in index.summaries.values())
    return {
        "workers": workers,
        "blocks": blocks,
        "bytes": used,
        "bytes_per_block": used / blocks,
        "accounted_bytes_per_block": BYTES_PER_BLOCK,
    }


# ---- the command ------------------------------------------------------------------------


def run_sim(
    worker_counts: Sequence[int], traces: Sequence[str], policies: Sequence[str], seed: int
) -> list[dict[str, Any]]:
    rows = []
    for name in traces:
        for w in worker_counts:
            config = SimConfig(workers=w, seed=seed)
            trace = TRACES[name](w, seed, config.block_size)
            for policy in policies:
                t0 = time.perf_counter()
                figures = simulate(trace, policy, config)
                rows.append(
                    {
                        "trace": name,
                        "workers": w,
                        "policy": policy,
                        **figures,
                        "sim_seconds": time.perf_counter() - t0,
                    }
                )
                _print_row(rows[-1])
    return rows


def cost_sweep(
    workers: int = 8, values: Sequence[int] = (16, 32, 64, 128, 256), seed: int = 0
) -> list[dict[str, Any]]:
    """cache_aware on the grouped trace for several `request_cost_tokens` (default 64)."""
    trace = grouped_trace(workers, seed)
    rows = []
    for value in values:
        config = SimConfig(workers=workers, request_cost_tokens=value, seed=seed)
        rows.append({"request_cost_tokens": value, **simulate(trace, "cache_aware", config)})
        r = rows[-1]
        print(
            f"request_cost_tokens {value:>4}: hit {r['hit_rate']:.1%}, "
            f"{r['throughput_rps']:.1f} req/s, ttft p99 {r['ttft_p99_s'] * 1e3:.1f} ms",
            flush=True,
        )
    return rows


def replica_rows(
    worker_counts: Sequence[int],
    traces: Sequence[str],
    replica_counts: Sequence[int],
    sharings: Sequence[str],
    seed: int,
    event_delay_s: float = SimConfig.event_delay_s,
    oracle: bool = True,
    load_sharings: Sequence[str] = ("local",),
    partitions: Sequence[bool] = (False,),
) -> list[dict[str, Any]]:
    """cache_aware behind several router replicas: one row per trace x workers x replicas
    x sharing x load sharing x cold partition (one replica: one row, the single router,
    which every sharing reduces to), and the oracle's. `hit_rate_vs_one` is the hit rate
    over the one router's on the same trace, workers and event delay; `ttft_p99_vs_one` its
    TTFT p99 likewise."""
    rows = []
    for name in traces:
        for w in worker_counts:
            trace = TRACES[name](w, seed, SimConfig.block_size)
            runs = [(1, "local", "local", False)] + [
                (r, s, load, part)
                for r in replica_counts
                if r > 1
                for s in sharings
                for load in load_sharings
                for part in partitions
            ]
            one: float | None = None
            one_p99 = 0.0
            for replicas, sharing, load, partition in runs:
                config = SimConfig(
                    workers=w,
                    seed=seed,
                    replicas=replicas,
                    sharing=sharing,
                    event_delay_s=event_delay_s,
                    load_sharing=load,
                    partition_cold=partition,
                )
                row = _replica_run(name, trace, "cache_aware", config)
                if one is None:
                    one, one_p99 = row["hit_rate"], row["ttft_p99_s"]
                row["hit_rate_vs_one"] = row["hit_rate"] / one if one else 1.0
                row["ttft_p99_vs_one"] = row["ttft_p99_s"] / one_p99 if one_p99 else 1.0
                rows.append(row)
                _print_replica_row(row)
            if oracle:
                config = SimConfig(workers=w, seed=seed, event_delay_s=event_delay_s)
                rows.append(_replica_run(name, trace, ORACLE, config))
                rows[-1]["hit_rate_vs_one"] = rows[-1]["hit_rate"] / one if one else 1.0
                rows[-1]["ttft_p99_vs_one"] = rows[-1]["ttft_p99_s"] / one_p99 if one_p99 else 1.0
                _print_replica_row(rows[-1])
    return rows


def _replica_run(name: str, trace: list[Request], policy: str, config: SimConfig) -> dict[str, Any]:
    observe = Observation()
    t0 = time.perf_counter()
    figures = simulate(trace, policy, config, observe)
    elapsed = time.perf_counter() - t0
    wall = [t for per in observe.route_us for t in per]
    cpu = [t for per in observe.route_cpu_us for t in per]
    return {
        "trace": name,
        "workers": config.workers,
        "policy": policy,
        "replicas": config.replicas,
        "sharing": config.sharing if config.replicas > 1 else "one router",
        "load_sharing": config.load_sharing if config.replicas > 1 else "one router",
        "partition_cold": config.partition_cold and config.replicas > 1,
        "event_delay_ms": config.event_delay_s * 1e3,
        **figures,
        # The simulator's route(): the real summaries and policy, wall and thread CPU time.
        "route_p50_us": percentile(wall, 50),
        "route_p99_us": percentile(wall, 99),
        "route_cpu_p50_us": percentile(cpu, 50),
        "route_cpu_p99_us": percentile(cpu, 99),
        "route_p99_us_by_replica": [percentile(per, 99) for per in observe.route_us if per],
        "sim_seconds": elapsed,
    }


# The host-tier comparison's trace: grouped, 12 groups of 2,048-token prefixes per worker.
# cache_aware places about 12 prefixes on each worker: 24,576 tokens (plus the questions)
# against a 16,384-token KV cache, which a 32,768-token host tier holds with room to spare.
TIER_GROUPS_PER_WORKER = 12
TIER_HOST_TOKENS = 32768


def tier_rows(
    workers: int = 8,
    rates: Sequence[float] = (10.0, 20.0, 30.0, 40.0),
    host_tokens: int = TIER_HOST_TOKENS,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Workers with a host-memory tier of `host_tokens`, per arrival rate (requests a second
    per worker): cache_aware tier-aware (the default `host_hit_cost`) and tier-blind
    (`host_hit_cost` 1.0: a host hit counts as a miss), against no host tier and the oracle
    (tier-aware on the true caches). Device hits, host hits and misses as shares of the
    prompt tokens."""
    rows = []
    for rate in rates:
        trace = grouped_trace(
            workers, seed, groups_per_worker=TIER_GROUPS_PER_WORKER, rate_per_worker=rate
        )
        ideal = ideal_miss_rate(trace)
        base = SimConfig(workers=workers, seed=seed)
        tiered = replace(base, host_capacity_tokens=host_tokens)
        runs = [
            ("no host tier", "cache_aware", base),
            ("tier-blind", "cache_aware", replace(tiered, host_hit_cost=1.0)),
            ("tier-aware", "cache_aware", tiered),
            ("oracle", ORACLE, tiered),
        ]
        for router, policy, config in runs:
            figures = simulate(trace, policy, config)
            hits = figures["hit_rate"] + figures["host_hit_rate"]
            rows.append(
                {
                    "rate_per_worker": rate,
                    "router": router,
                    "host_capacity_tokens": config.host_capacity_tokens,
                    "host_hit_cost": config.host_hit_cost,
                    **figures,
                    "miss_rate": 1.0 - hits,
                    "ideal_miss_rate": ideal,
                }
            )
            _print_tier_row(rows[-1])
    return rows


def host_hit_cost_sweep(
    workers: int = 8,
    rates: Sequence[float] = (20.0, 30.0),
    costs: Sequence[float] = (0.0, 0.1, 0.2, 0.5, 0.8, 1.0),
    host_tokens: int = TIER_HOST_TOKENS,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """cache_aware over the host-tier comparison's trace, by `host_hit_cost`."""
    rows = []
    for rate in rates:
        trace = grouped_trace(
            workers, seed, groups_per_worker=TIER_GROUPS_PER_WORKER, rate_per_worker=rate
        )
        config = SimConfig(workers=workers, seed=seed, host_capacity_tokens=host_tokens)
        for cost in costs:
            figures = simulate(trace, "cache_aware", replace(config, host_hit_cost=cost))
            hits = figures["hit_rate"] + figures["host_hit_rate"]
            rows.append(
                {
                    "rate_per_worker": rate,
                    "router": f"cost {cost:g}",
                    "host_hit_cost": cost,
                    **figures,
                    "miss_rate": 1.0 - hits,
                    "ideal_miss_rate": ideal_miss_rate(trace),
                }
            )
            _print_tier_row(rows[-1])
    return rows


# The hot-prefix workloads: (name, hot prefix and every group's prefix in tokens, each
# worker's KV cache in tokens). The long one keeps 8 prefixes a worker, as the short one.
HOT_WORKLOADS = (("2k prefix", 2048, SimConfig.capacity_tokens), ("8k prefix", 8192, 65536))


def hot_rows(
    workers: int = 8,
    rates: Sequence[float] = (10.0, 15.0, 20.0),
    seeds: Sequence[int] = (0, 1, 2, 3),
) -> list[dict[str, Any]]:
    """cache_aware with and without hot-prefix replication on the hot-prefix traces (one
    prefix: 60% of the requests), per workload, arrival rate (requests a second per
    worker) and seed; then per workload and rate, over the seeds: the mean goodput of
    each and their ratio, the hit rates' mean difference."""
    rows = []
    for workload, prefix_len, capacity in HOT_WORKLOADS:
        for rate in rates:
            runs = []
            for seed in seeds:
                trace = hot_prefix_trace(workers, seed, rate_per_worker=rate, prefix_len=prefix_len)
                plain = SimConfig(workers=workers, seed=seed, capacity_tokens=capacity)
                pair = {}
                for router, config in (
                    ("cache_aware", plain),
                    ("hot prefixes", replace(plain, hot_prefixes=True)),
                ):
                    pair[router] = simulate(trace, "cache_aware", config)
                    row = {"workload": workload, "rate_per_worker": rate, "seed": seed}
                    rows.append({**row, "router": router, **pair[router]})
                    _print_hot_row(rows[-1])
                runs.append(pair)
            good = {r: sum(p[r]["goodput_rps"] for p in runs) / len(runs) for r in runs[0]}
            hit = {r: sum(p[r]["hit_rate"] for p in runs) / len(runs) for r in runs[0]}
            rows.append(
                {
                    "workload": workload,
                    "rate_per_worker": rate,
                    "seed": "mean",
                    "router": "hot prefixes / cache_aware",
                    "goodput_rps": good["hot prefixes"],
                    "cache_aware_goodput_rps": good["cache_aware"],
                    "goodput_ratio": good["hot prefixes"] / good["cache_aware"],
                    "hit_rate_points": 100 * (hit["hot prefixes"] - hit["cache_aware"]),
                    "goodput_ratio_by_seed": [
                        p["hot prefixes"]["goodput_rps"] / p["cache_aware"]["goodput_rps"]
                        for p in runs
                    ],
                }
            )
            r = rows[-1]
            print(
                f"{workload:<9} {rate:>5g} mean goodput {r['cache_aware_goodput_rps']:.1f} -> "
                f"{r['goodput_rps']:.1f} ({r['goodput_ratio']:.2f}x; by seed "
                f"{', '.join(f'{x:.2f}' for x in r['goodput_ratio_by_seed'])}), hit rate "
                f"{r['hit_rate_points']:+.2f} points",
                flush=True,
            )
    return rows


def _print_hot_row(r: dict[str, Any]) -> None:
    print(
        f"{r['workload']:<9} {r['rate_per_worker']:>5g} {r['seed']:>4} {r['router']:<13}"
        f" {r['hit_rate']:>7.1%} {r['throughput_rps']:>7.1f} {r['goodput_rps']:>7.1f}"
        f" {r['ttft_p50_s'] * 1e3:>8.0f} {r['ttft_p99_s'] * 1e3:>8.0f}"
        f" {r['max_worker_share']:>6.3f}",
        flush=True,
    )


def ideal_miss_rate(trace: list[Request], block_size: int = SimConfig.block_size) -> float:
    """The share of prompt tokens that miss in one cache of unbounded size: what no router
    can avoid (each prefix's first request, every request's own tokens)."""
    seen: set[int] = set()
    hit = 0
    for req in sorted(trace, key=lambda r: r.arrival):
        n = 0
        for h in req.prompt_hashes:
            if h not in seen:
                break
            n += 1
        hit += n * block_size
        seen.update(req.full_hashes)
    return 1.0 - hit / sum(r.prompt_len for r in trace)


def _print_tier_row(r: dict[str, Any]) -> None:
    print(
        f"{r['rate_per_worker']:>5g} {r['router']:<13} {r['hit_rate']:>7.1%}"
        f" {r['host_hit_rate']:>7.1%} {r['miss_rate']:>7.1%} {r['throughput_rps']:>7.1f}"
        f" {r['ttft_p50_s'] * 1e3:>8.0f} {r['ttft_p99_s'] * 1e3:>8.0f}"
        f" {r['ideal_miss_rate']:>7.1%}",
        flush=True,
    )


def _print_replica_row(r: dict[str, Any]) -> None:
    print(
        f"{r['trace']:<10} {r['workers']:>3} {r['event_delay_ms']:>4g} {r['policy']:<12}"
        f" {r['replicas']:>2} {r['sharing']:<17} {r['load_sharing']:<17}"
        f" {'yes' if r['partition_cold'] else 'no':<4} {r['hit_rate']:>7.2%}"
        f" {r['hit_rate_vs_one']:>7.2%} {r['ttft_p99_s'] * 1e3:>8.0f}"
        f" {r['ttft_p99_vs_one']:>5.2f}"
        f" {r['route_p50_us']:>6.0f} {r['route_p99_us']:>7.0f} {r['route_cpu_p99_us']:>7.0f}",
        flush=True,
    )


def _print_row(r: dict[str, Any]) -> None:
    print(
        f"{r['trace']:<10} {r['workers']:>3} {r['policy']:<23} {r['hit_rate']:>7.1%} "
        f"{r['throughput_rps']:>9.1f} {r['ttft_p50_s'] * 1e3:>9.1f} {r['ttft_p99_s'] * 1e3:>10.1f}"
        f" {r['max_worker_share']:>6.3f}",
        flush=True,
    )


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets at 8 workers on the grouped trace: cache_aware's hit rate against the
    oracle's and its throughput against round_robin's (reported, not asserted)."""
    at = {r["policy"]: r for r in rows if r["trace"] == "grouped" and r["workers"] == 8}
    if not {"cache_aware", "round_robin", ORACLE} <= at.keys():
        return {}
    ca, rr, oracle = at["cache_aware"], at["round_robin"], at[ORACLE]
    return {
        "cache_aware_hit_rate_vs_oracle": ca["hit_rate"] / oracle["hit_rate"],
        "cache_aware_throughput_vs_round_robin": ca["throughput_rps"] / rr["throughput_rps"],
    }


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _sharings(text: str) -> list[str]:
    names = text.split(",")
    for name in names:
        if name not in SHARING:
            raise argparse.ArgumentTypeError(f"unknown sharing {name!r}; choose from {SHARING}")
    return names


def _load_sharings(text: str) -> list[str]:
    names = text.split(",")
    for name in names:
        if name not in LOAD_SHARING:
            raise argparse.ArgumentTypeError(
                f"unknown load sharing {name!r}; choose from {LOAD_SHARING}"
            )
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[8, 16, 64])
    p.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    p.add_argument("--policies", nargs="+", default=[*sorted(POLICIES), ORACLE])
    p.add_argument(
        "--section",
        nargs="+",
        choices=["all", "sim", "latency", "memory", "replicas", "tiers", "hot"],
        default=["all"],
        help="parts to run; other than all, the JSON is router_sim-<parts>-<machine>.json",
    )
    p.add_argument(
        "--replica-workers",
        type=int,
        nargs="+",
        default=[8, 64],
        help="replicas: worker counts (the full sweep: 8 64 128 256)",
    )
    p.add_argument(
        "--replica-traces", nargs="+", default=["grouped", "multiturn"], choices=list(TRACES)
    )
    p.add_argument("--replicas", type=_ints, default=[1, 2, 4, 8], help="replicas: e.g. 1,2,4,8")
    p.add_argument(
        "--sharing",
        type=_sharings,
        default=["local", "worker-announced"],
        help=f"replicas: comma-separated, of {','.join(SHARING)}",
    )
    p.add_argument(
        "--load-sharing",
        type=_load_sharings,
        default=["local"],
        help=f"replicas: comma-separated, of {','.join(LOAD_SHARING)}",
    )
    p.add_argument(
        "--partition-cold",
        nargs="+",
        choices=["off", "on"],
        default=["off"],
        help="replicas: cache_aware's cold_partition off and / or on",
    )
    p.add_argument(
        "--event-delays",
        type=_floats,
        default=[1.0, 5.0, 20.0],
        help="replicas: event delays (ms) for worker-announced at --delay-workers, grouped",
    )
    p.add_argument("--delay-workers", type=int, default=64)
    p.add_argument(
        "--tier-rates",
        type=_floats,
        default=[10.0, 20.0, 30.0, 40.0],
        help="tiers: arrival rates (requests a second per worker), e.g. 10,20",
    )
    p.add_argument("--quick", action="store_true", help="8 workers only, fewer decisions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-write", action="store_true", help="print only; write no JSON")
    record.add_output_arguments(p)
    return p.parse_args(argv)


def sim_section(args: argparse.Namespace) -> dict[str, Any]:
    worker_counts = [8] if args.quick else args.workers
    print(
        f"{'trace':<10} {'W':>3} {'policy':<23} {'hit':>7} {'req/s':>9} "
        f"{'ttft p50':>9} {'ttft p99':>10} {'share':>6}   (ms)"
    )
    rows = run_sim(worker_counts, args.traces, args.policies, args.seed)
    out: dict[str, Any] = {"sim": rows, "targets": targets(rows)}
    for k, v in out["targets"].items():
        print(f"{k}: {v:.3f}")
    if not args.quick:
        print("cache_aware on the grouped trace at 8 workers, by request_cost_tokens:")
        out["request_cost_tokens_sweep"] = cost_sweep(seed=args.seed)
        print("cache_aware with parts of its cost switched off:")
        out["ablations"] = run_sim(worker_counts, args.traces, list(ABLATIONS), args.seed)
    return out


def latency_section(args: argparse.Namespace) -> dict[str, Any]:
    lat = decision_latency(decisions=300 if args.quick else 2000, rounds=1 if args.quick else 3)
    print(
        f"routing decision at {lat['workers']} workers x {lat['blocks_per_worker']} "
        f"blocks, {lat['prompt_len']}-token prompt: p50 {lat['p50_us']:.1f} us, "
        f"p99 {lat['p99_us']:.1f} us (best of {len(lat['rounds'])} rounds by p99; "
        f"all p99: {', '.join(str(round(r['total_p99_us'])) for r in lat['rounds'])}); "
        f"thread CPU time p50 {lat['cpu_p50_us']:.1f} us, p99 {lat['cpu_p99_us']:.1f} us"
    )
    return {"decision_latency": lat}


def memory_section(args: argparse.Namespace) -> dict[str, Any]:
    mem = summary_memory(seed=args.seed)
    print(
        f"summary memory: {mem['bytes_per_block']:.1f} bytes per cached block "
        f"({mem['blocks']} blocks, tracemalloc)"
    )
    return {"summary_memory": mem}


def replicas_section(args: argparse.Namespace) -> dict[str, Any]:
    worker_counts = [8] if args.quick else args.replica_workers
    header = (
        f"{'trace':<10} {'W':>3} {'ms':>4} {'policy':<12} {'R':>2} {'sharing':<17} "
        f"{'load':<17} {'part':<4} {'hit':>7} {'vs one':>7} {'ttft p99':>8} {'x one':>5} "
        f"{'rt p50':>6} {'rt p99':>7} {'cpu p99':>7}"
        "   (ms, route time us)"
    )
    print(header)
    rows = replica_rows(
        worker_counts,
        args.replica_traces,
        args.replicas,
        args.sharing,
        args.seed,
        load_sharings=args.load_sharing,
        partitions=[{"off": False, "on": True}[x] for x in args.partition_cold],
    )
    out: dict[str, Any] = {"replicas": rows}
    # The main table already holds the default delay's rows when it covers the sweep's size.
    done = args.delay_workers in worker_counts and "grouped" in args.replica_traces
    delays = [d for d in args.event_delays if not (done and d == SimConfig.event_delay_s * 1e3)]
    if delays and not args.quick:
        print(f"worker-announced by event delay, grouped trace, {args.delay_workers} workers:")
        sweep = []
        for ms in delays:
            sweep += replica_rows(
                [args.delay_workers],
                ["grouped"],
                args.replicas,
                ["worker-announced"],
                args.seed,
                event_delay_s=ms / 1e3,
                oracle=False,
            )
        out["replicas_by_event_delay"] = sweep
    return out


def tiers_section(args: argparse.Namespace) -> dict[str, Any]:
    workers = 8
    print(
        f"host-memory tiers, {workers} workers ({SimConfig.capacity_tokens}-token KV cache + "
        f"{TIER_HOST_TOKENS}-token host tier each), grouped trace, "
        f"{TIER_GROUPS_PER_WORKER} groups per worker:"
    )
    print(
        f"{'req/s':>5} {'router':<13} {'device':>7} {'host':>7} {'miss':>7} {'req/s':>7}"
        f" {'ttft p50':>8} {'ttft p99':>8} {'ideal':>7}"
        "   (in per worker; shares of prompt tokens; ms; the ideal miss rate)"
    )
    rates = [20.0] if args.quick else args.tier_rates
    rows = tier_rows(workers, rates, seed=args.seed)
    out: dict[str, Any] = {
        "tiers": {
            "workers": workers,
            "trace": f"grouped, {TIER_GROUPS_PER_WORKER}W groups x 24 requests, 2048-token "
            "prefix + 64 own, 16 out, Poisson per worker at each rate, Zipf(0.6) groups",
            "capacity_tokens": SimConfig.capacity_tokens,
            "host_capacity_tokens": TIER_HOST_TOKENS,
            "reload_token_s": CostModel.reload_token_s,
            "prefill_token_s": CostModel.prefill_token_s,
            "rows": rows,
        }
    }
    if not args.quick:
        print("tier-aware cache_aware by host_hit_cost:")
        out["tiers_by_host_hit_cost"] = host_hit_cost_sweep(workers, seed=args.seed)
    return out


def hot_section(args: argparse.Namespace) -> dict[str, Any]:
    print(
        f"hot prefix (60% of the requests, 128 output tokens), 8 workers, goodput: TTFT <= "
        f"{SimConfig.ttft_slo_s * 1e3:.0f} ms"
    )
    print(
        f"{'workload':<9} {'req/s':>5} {'seed':>4} {'router':<13} {'hit':>7} {'req/s':>7}"
        f" {'good':>7} {'ttft p50':>8} {'ttft p99':>8} {'share':>6}   (in per worker; ms)"
    )
    if args.quick:
        return {"hot_prefix": hot_rows(rates=[15.0], seeds=[args.seed])}
    seeds = [args.seed + i for i in range(4)]
    return {"hot_prefix": hot_rows(rates=[10.0, 15.0, 20.0], seeds=seeds)}


SECTIONS = {
    "sim": sim_section,
    "latency": latency_section,
    "memory": memory_section,
    "replicas": replicas_section,
    "tiers": tiers_section,
    "hot": hot_section,
}
TRACE_NOTES = {
    "grouped": "4W groups x 24 requests, 2048-token prefix + 64 own, 16 out, "
    "Poisson 40 req/s per worker, Zipf(0.6) groups",
    "hot": "the grouped trace over 2W groups, Zipf(1.5): one group brings about half",
    "hot_prefix": "(section hot) the grouped trace with 48 requests a group, 128 out, one "
    "group 60% of the requests, Poisson 10 / 15 / 20 req/s per worker, seeds 0-3; 2k "
    "prefix: 2048-token prefixes, 16384-token KV caches; 8k prefix: 8192-token prefixes, "
    "65536-token KV caches",
    "multiturn": "12W chats x 6 turns, 512 first + 128 per message, 64 out, "
    "chat starts Poisson 2/s per worker, think time exp(2 s)",
    "noshare": "48W unique 1024-token prompts, 64 out, Poisson 10 req/s per worker",
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = record.now()
    figures: dict[str, Any] = {
        "parameters": {"sim": asdict(SimConfig(workers=0, seed=args.seed)), "traces": TRACE_NOTES}
    }
    sections = set(SECTIONS) if "all" in args.section else set(args.section)
    for name in sorted(sections, key=list(SECTIONS).index):
        figures.update(SECTIONS[name](args))
    if not args.no_write:
        # A partial run gets its own file: it must not replace a full run's figures.
        parts = None if sections == set(SECTIONS) else "-".join(sorted(sections))
        record.write("router_sim", args, figures, date=started, name=parts)
    return figures


if __name__ == "__main__":
    main()
