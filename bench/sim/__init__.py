"""Router simulator: the real routing policies and prefix summaries over simulated workers.

A discrete-event simulation of a cluster of W workers behind the router. What is real and
what is modelled:

- REAL: `radixmesh.router.policy` (`POLICIES`, `Candidate`: every registered policy),
  `radixmesh.router.summary` (`SummaryIndex`: per-worker summaries under a byte budget,
  tentative entries with a time-to-live on the simulated clock) and the shared block
  hashing `radixmesh.prefix.block_hashes`. The router step mirrors
  `ControlPlane.pick`: match the prompt's chained hashes against every summary, build
  one `Candidate` per worker (queued = the worker's running + waiting requests, which the
  real router knows from its own in-flight counts), let the policy choose, add the prompt
  as tentative on the chosen worker, enforce the budget.
- MODELLED: each worker's radix cache, at block granularity: a block-LRU keyed by the same
  chained hashes (`BlockCache`; not the worker's `RadixCache`, which needs a torch KV pool).
  A path is touched leaf-first so that ancestors are always more recent than their
  descendants: the least recently used unpinned block is then always a leaf, as in a
  radix tree. Blocks of running requests are pinned, and the cache is the KV pool: a
  request is admitted only when its prompt's blocks fit beside the pinned ones (output
  tokens' KV is not counted). The worker publishes "stored" events when a step that
  prefills a prompt starts (the real scheduler puts a prefilled chunk in its tree when it
  launches the forward; and for prompt + output at finish) and "removed" events when it
  evicts; the router applies them `event_delay_s` later. A request that waits in a
  worker's queue is therefore known only to the router that placed it (its tentative
  entry) until the step that prefills it starts.
- MODELLED: a host-memory tier per worker (`SimConfig.host_capacity_tokens`, off by
  default; `HostTier`): the blocks the KV cache evicts go there ("offloaded" events) and
  leave it LRU ("removed"); a prompt's blocks found there right after its device hits are
  reloaded ("loaded") at `CostModel.reload_token_s` a token instead of prefilled. The
  router matches tiered summaries and weighs host hits at `SimConfig.host_hit_cost`.
- MODELLED: several router replicas (`SimConfig.replicas`), the requests spread over them
  round robin. Each has its own `SummaryIndex` (all apply every worker's events, each
  `event_delay_s` after it was published), its own tentative entries and its own load view
  (its in-flight requests per worker, the workers' load polled every `health_interval_s`),
  as separate router processes have. `SimConfig.sharing` says how a replica learns the
  others' placements (`SHARING`) and `SimConfig.load_sharing` how it learns the load they
  put on each worker (`LOAD_SHARING`).
- MODELLED: the cost of a forward step (`CostModel`): a fixed overhead, a cost per
  uncached prompt token prefilled in the step and a cost per running sequence decoded;
  continuous batching up to `max_batch` requests and `max_prefill_tokens` per step.

The oracle is cache_aware's cost computed from the truth instead of the summaries: each
worker's TRUE cache contents (the block-LRU, plus the prompts already queued there, which
it will hold by the time a new request runs; no event delay, no budget, no time-to-live)
and its exact queue length.

Traces (seeded, token ids random): `grouped` (4 x W groups of a 2,048-token system prompt,
a unique 64-token question each, 16 output tokens, Poisson arrivals, group popularity
Zipf(0.6); the prompts together need ~4 worker caches at W=8), `multiturn` (conversations
of 6 turns, each turn's prompt is the whole history plus a new message, think time between
turns) and `noshare` (unique prompts: the control).
"""

from __future__ import annotations

from bench.sim.config import (
    ABLATIONS,
    LOAD_SHARING,
    ORACLE,
    SHARING,
    VOCAB,
    CostModel,
    Request,
    SimConfig,
)
from bench.sim.router import SimClock, SimRouter
from bench.sim.simulation import Observation, Simulation, owner, percentile, simulate
from bench.sim.traces import (
    TRACES,
    grouped_trace,
    hot_prefix_trace,
    hot_trace,
    multiturn_trace,
    noshare_trace,
    random_tokens,
)
from bench.sim.worker import BlockCache, HostTier, Outcome, Running, SimWorker

__all__ = [
    "ABLATIONS",
    "LOAD_SHARING",
    "ORACLE",
    "SHARING",
    "TRACES",
    "VOCAB",
    "BlockCache",
    "CostModel",
    "HostTier",
    "Observation",
    "Outcome",
    "Request",
    "Running",
    "SimClock",
    "SimConfig",
    "SimRouter",
    "SimWorker",
    "Simulation",
    "grouped_trace",
    "hot_prefix_trace",
    "hot_trace",
    "multiturn_trace",
    "noshare_trace",
    "owner",
    "percentile",
    "random_tokens",
    "simulate",
]
