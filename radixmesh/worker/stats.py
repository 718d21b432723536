"""SchedulerStats: a worker's counters, as the scheduler reports them (no torch here: the
worker's server process reads them without loading the engine's modules)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_slots_used: int  # held by running requests or the tree
    kv_slots_total: int
    cache_size: int
    cache_hit_tokens: int
    prompt_tokens: int
    generated_tokens: int
    num_retractions: int
    num_steps: int
    constrained_requests: int = 0
    jump_forward_tokens: int = 0  # output tokens appended without a decode step
    grammar_compiles: int = 0  # constraints compiled (not found in the compiled cache)
    num_aborted: int = 0  # requests that ended aborted (by a client, a failure, shutdown)
    # The host-memory KV tier (zeros without one): prompt tokens reloaded from it (part of
    # cache_hit_tokens), its slots, the bytes copied each way, and the copies' bandwidth
    # (bytes over their measured GPU time so far; 0 on CPU, where copies are not timed).
    host_cache_hit_tokens: int = 0
    host_kv_slots_used: int = 0
    host_kv_slots_total: int = 0
    host_kv_bytes_loaded: int = 0
    host_kv_bytes_written: int = 0
    host_kv_load_bandwidth: float = 0.0
    host_kv_write_bandwidth: float = 0.0
    # Speculative decoding (zeros when off): request-steps that verified drafts, tokens
    # drafted and accepted, and how many steps accepted 0, 1, ... k drafts.
    spec_verify_steps: int = 0
    spec_drafted_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accept_lengths: tuple[int, ...] = ()

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
