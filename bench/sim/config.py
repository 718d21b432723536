"""The simulator's configuration: workers, cost model, router replicas, requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ORACLE = "oracle"
# cache_aware with a part of its cost switched off (not a registered policy): what the
# pending-prefill term buys, reported apart.
ABLATIONS: dict[str, dict[str, Any]] = {"cache_aware_no_pending": {"pending_prefill_weight": 0.0}}
VOCAB = 32000
# How router replicas learn the placements the others made and the workers have not yet
# reported cached: `local` (they do not: tentative entries stay in the replica that routed),
# `worker-announced` (a worker publishes a "pending" event for a prompt's blocks when it
# receives the request; every replica applies it after the event delay, as a tentative
# entry), `owner` (a prefix's first block names the replica that routes it; the others
# forward to it).
SHARING = ("local", "worker-announced", "owner")
# How router replicas learn the load the others put on a worker: `local` (each knows its own
# requests in flight and pending prefill, and the worker's load polled every
# `health_interval_s`), `worker-announced` (the worker publishes each request's arrival, its
# first token and its end on its cache-event stream; every replica counts the others'
# requests from those, an event delay late, its pending prefill estimated from its summary).
LOAD_SHARING = ("local", "worker-announced")


@dataclass(frozen=True)
class CostModel:
    """Seconds per forward step: step_s + prefill_token_s * new tokens + decode_seq_s * B
    + reload_token_s * tokens reloaded from host memory."""

    step_s: float = 0.010
    prefill_token_s: float = 50e-6  # ~20k prefill tokens/s: an 8B model on one GPU
    decode_seq_s: float = 0.15e-3
    # A prompt token reloaded from the worker's host-memory tier: an 8B model's ~128 KiB of
    # KV a token over PCIe at ~25 GB/s (a tenth of prefilling it).
    reload_token_s: float = 5e-6
    max_batch: int = 64  # running requests per worker
    max_prefill_tokens: int = 8192  # new prompt tokens per step (at least one request)


@dataclass(frozen=True)
class SimConfig:
    workers: int
    capacity_tokens: int = 16384  # each worker's KV cache
    # Each worker's host-memory tier (blocks evicted from the KV cache, LRU; 0: none).
    host_capacity_tokens: int = 0
    block_size: int = 16  # the event block size (router and worker hash the same blocks)
    cost: CostModel = field(default_factory=CostModel)
    event_delay_s: float = 0.005  # a cache event's trip from worker to router
    tentative_ttl: float = 5.0  # RouterConfig's default
    request_cost_tokens: int = 64  # RouterConfig's default
    host_hit_cost: float = 0.2  # RouterConfig's default (1.0: the policy is tier-blind)
    summary_budget_bytes: int = 256 * 1024 * 1024
    seed: int = 0
    # Router replicas in front of the same workers; clients spread requests over them
    # round robin. Each has its own tentative entries and in-flight counts.
    replicas: int = 1
    sharing: str = "local"  # how replicas learn each other's placements: one of SHARING
    health_interval_s: float = 1.0  # RouterConfig.health_interval: load polls per worker
    forward_s: float = 0.0005  # `owner`: a non-owner replica's hop to the prefix's owner
    load_sharing: str = "local"  # how replicas learn the others' load: one of LOAD_SHARING
    # With shared load: the weight of the other replicas' pending prefill in a replica's
    # view (its own counts in full). `radixmesh.router.pool.SHARED_PENDING_WEIGHT`.
    shared_pending_weight: float = 0.25
    # cache_aware's `cold_partition` for each replica (its index, `replicas`): a prompt no
    # worker caches goes to the replica's share of the workers, unless a worker outside it
    # is cheaper by more than one prefill of it (`PolicyOptions.off_share_prefills`).
    partition_cold: bool = False
    # cache_aware with hot-prefix replication (`radixmesh.router.hot.HotPrefixes`).
    hot_prefixes: bool = False
    ttft_slo_s: float = 0.5  # goodput: requests a second whose time to first token is within

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.sharing not in SHARING:
            raise ValueError(f"sharing must be one of {SHARING}, got {self.sharing!r}")
        if self.load_sharing not in LOAD_SHARING:
            raise ValueError(
                f"load_sharing must be one of {LOAD_SHARING}, got {self.load_sharing!r}"
            )
        if not 0 <= self.shared_pending_weight <= 1:
            raise ValueError(
                f"shared_pending_weight must be in [0, 1], got {self.shared_pending_weight}"
            )
        if self.health_interval_s <= 0:
            raise ValueError(f"health_interval_s must be > 0, got {self.health_interval_s}")
        if self.host_capacity_tokens < 0:
            raise ValueError(f"host_capacity_tokens must be >= 0, got {self.host_capacity_tokens}")
        if not 0 <= self.host_hit_cost <= 1:
            raise ValueError(f"host_hit_cost must be in [0, 1], got {self.host_hit_cost}")

    @property
    def capacity_blocks(self) -> int:
        return self.capacity_tokens // self.block_size

    @property
    def host_capacity_blocks(self) -> int:
        return self.host_capacity_tokens // self.block_size


@dataclass
class Request:
    rid: int
    arrival: float  # absolute; for a later turn, seconds after the previous turn finishes
    prompt_len: int
    output_len: int
    prompt_hashes: list[int]
    full_hashes: list[int]  # prompt + output (what the worker caches at finish)
    after: int | None = None  # the previous turn's rid (multi-turn)
