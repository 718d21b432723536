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
- MODELLED: several router replicas (`SimConfig.replicas`), the requests spread over them
  round robin. Each has its own `SummaryIndex` (all apply every worker's events, each
  `event_delay_s` after it was published), its own tentative entries and its own load view
  (its in-flight requests per worker, the workers' load polled every `health_interval_s`),
  as separate router processes have. `SimConfig.sharing` says how a replica learns the
  others' placements (`SHARING`).
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

import heapq
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixmesh.prefix import block_hashes
from radixmesh.router.policy import POLICIES, Candidate, Policy, PolicyOptions
from radixmesh.router.summary import BYTES_PER_BLOCK, SummaryIndex

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


# ---- configuration ----------------------------------------------------------------------


@dataclass(frozen=True)
class CostModel:
    """Seconds per forward step: step_s + prefill_token_s * new tokens + decode_seq_s * B."""

    step_s: float = 0.010
    prefill_token_s: float = 50e-6  # ~20k prefill tokens/s: an 8B model on one GPU
    decode_seq_s: float = 0.15e-3
    max_batch: int = 64  # running requests per worker
    max_prefill_tokens: int = 8192  # new prompt tokens per step (at least one request)


@dataclass(frozen=True)
class SimConfig:
    workers: int
    capacity_tokens: int = 16384  # each worker's KV cache
    block_size: int = 16  # the event block size (router and worker hash the same blocks)
    cost: CostModel = field(default_factory=CostModel)
    event_delay_s: float = 0.005  # a cache event's trip from worker to router
    tentative_ttl: float = 5.0  # RouterConfig's default
    request_cost_tokens: int = 64  # RouterConfig's default
    summary_budget_bytes: int = 256 * 1024 * 1024
    seed: int = 0
    # Router replicas in front of the same workers; clients spread requests over them
    # round robin. Each has its own tentative entries and in-flight counts.
    replicas: int = 1
    sharing: str = "local"  # how replicas learn each other's placements: one of SHARING
    health_interval_s: float = 1.0  # RouterConfig.health_interval: load polls per worker
    forward_s: float = 0.0005  # `owner`: a non-owner replica's hop to the prefix's owner

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.sharing not in SHARING:
            raise ValueError(f"sharing must be one of {SHARING}, got {self.sharing!r}")
        if self.health_interval_s <= 0:
            raise ValueError(f"health_interval_s must be > 0, got {self.health_interval_s}")

    @property
    def capacity_blocks(self) -> int:
        return self.capacity_tokens // self.block_size


@dataclass
class Request:
    rid: int
    arrival: float  # absolute; for a later turn, seconds after the previous turn finishes
    prompt_len: int
    output_len: int
    prompt_hashes: list[int]
    full_hashes: list[int]  # prompt + output (what the worker caches at finish)
    after: int | None = None  # the previous turn's rid (multi-turn)


# ---- traces -----------------------------------------------------------------------------


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def _poisson(rng: random.Random, rate: float, n: int) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def grouped_trace(
    workers: int,
    seed: int,
    block_size: int = 16,
    groups_per_worker: int = 4,
    requests_per_group: int = 24,
    prefix_len: int = 2048,
    question_len: int = 64,
    output_len: int = 16,
    rate_per_worker: float = 40.0,
    zipf: float = 0.6,
) -> list[Request]:
    """Many groups of requests sharing a long system prompt; popularity Zipf-skewed."""
    rng = random.Random(seed)
    n_groups = groups_per_worker * workers
    prefixes = [random_tokens(rng, prefix_len) for _ in range(n_groups)]
    prefix_hashes = [block_hashes(p, block_size) for p in prefixes]
    weights = [1.0 / (g + 1) ** zipf for g in range(n_groups)]
    n = requests_per_group * n_groups
    arrivals = _poisson(rng, rate_per_worker * workers, n)
    out = []
    for rid, (arrival, g) in enumerate(
        zip(arrivals, rng.choices(range(n_groups), weights, k=n), strict=True)
    ):
        question, answer = random_tokens(rng, question_len), random_tokens(rng, output_len)
        # Continue the group's chain (the prefix is block-aligned) instead of rehashing it.
        root = prefix_hashes[g]
        ph = root + block_hashes(question, block_size, root[-1])
        full = root + block_hashes(question + answer, block_size, root[-1])
        out.append(Request(rid, arrival, prefix_len + question_len, output_len, ph, full))
    return out


def multiturn_trace(
    workers: int,
    seed: int,
    block_size: int = 16,
    chats_per_worker: int = 12,
    turns: int = 6,
    first_len: int = 512,
    message_len: int = 128,
    output_len: int = 64,
    start_rate_per_worker: float = 2.0,
    think_s: float = 2.0,
) -> list[Request]:
    """Chats: each turn's prompt is the previous prompt + its answer + a new message."""
    rng = random.Random(seed)
    n_chats = chats_per_worker * workers
    starts = _poisson(rng, start_rate_per_worker * workers, n_chats)
    out: list[Request] = []
    for start in starts:
        history: list[int] = []
        prev: int | None = None
        for turn in range(turns):
            history = history + random_tokens(rng, first_len if turn == 0 else message_len)
            answer = random_tokens(rng, output_len)
            full = block_hashes(history + answer, block_size)
            prompt = full[: len(history) // block_size]
            arrival = start if prev is None else rng.expovariate(1.0 / think_s)
            rid = len(out)
            out.append(Request(rid, arrival, len(history), output_len, prompt, full, prev))
            history, prev = history + answer, rid
    return out


def noshare_trace(
    workers: int,
    seed: int,
    block_size: int = 16,
    requests_per_worker: int = 48,
    prompt_len: int = 1024,
    output_len: int = 64,
    rate_per_worker: float = 10.0,
) -> list[Request]:
    """Unique prompts: nothing to share (the control)."""
    rng = random.Random(seed)
    n = requests_per_worker * workers
    out = []
    for rid, arrival in enumerate(_poisson(rng, rate_per_worker * workers, n)):
        ids = random_tokens(rng, prompt_len + output_len)
        full = block_hashes(ids, block_size)
        out.append(
            Request(rid, arrival, prompt_len, output_len, full[: prompt_len // block_size], full)
        )
    return out


def hot_trace(workers: int, seed: int, block_size: int = 16) -> list[Request]:
    """The grouped trace with one hot group: Zipf(1.5) over 2 groups per worker, so the
    most popular group alone brings about half of all requests."""
    return grouped_trace(workers, seed, block_size, groups_per_worker=2, zipf=1.5)


TRACES: dict[str, Callable[..., list[Request]]] = {
    "grouped": grouped_trace,
    "hot": hot_trace,
    "multiturn": multiturn_trace,
    "noshare": noshare_trace,
}


# ---- a worker ---------------------------------------------------------------------------


class BlockCache:
    """A worker's radix cache at block granularity: LRU over chained block hashes.

    Every access touches a path leaf-first, so a block is always more recent than its
    descendants and the LRU order evicts leaves before their parents (as a radix tree
    does). Pinned blocks (held by running requests) are never evicted.
    """

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[int, int] = OrderedDict()  # hash -> pins; LRU first
        # Blocks with no pin: whether a path fits is asked at every admission, and counting
        # them over a full cache was most of a large simulation's time.
        self.unpinned = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def match(self, hashes: Sequence[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n

    def insert(self, hashes: Sequence[int], pin: bool) -> tuple[list[int], list[int]] | None:
        """Cache (and touch) a path; (stored, evicted) hashes, or None (and no change) when
        it cannot fit because too much is pinned."""
        blocks = self.blocks
        m = self.match(hashes)
        new = hashes[m:]
        keep = set(hashes[:m])
        need = len(blocks) + len(new) - self.capacity
        if need > 0:
            evictable = self.unpinned - sum(1 for h in hashes[:m] if not blocks[h])
            if evictable < need:
                return None
        evicted = self._evict(need, keep)
        for h in new:
            blocks[h] = 0
        self.unpinned += len(new)
        for h in reversed(hashes):
            blocks.move_to_end(h)
            if pin:
                if not blocks[h]:
                    self.unpinned -= 1
                blocks[h] += 1
        return list(new), evicted

    def unpin(self, hashes: Sequence[int]) -> None:
        blocks = self.blocks
        for h in hashes:
            blocks[h] -= 1
            if not blocks[h]:
                self.unpinned += 1

    def _evict(self, n: int, keep: set[int]) -> list[int]:
        """Drop up to `n` unpinned blocks, least recently used first, none of `keep`."""
        if n <= 0:
            return []
        victims = []
        for h, pins in self.blocks.items():
            if pins == 0 and h not in keep:
                victims.append(h)
                if len(victims) == n:
                    break
        for h in victims:
            del self.blocks[h]
        self.unpinned -= len(victims)
        return victims


@dataclass
class Running:
    req: Request
    pinned: list[int]  # the prompt blocks this request pins ([] when it ran uncached)
    generated: int = 0


@dataclass
class Outcome:
    worker: int = -1
    cached_tokens: int = 0
    first_token: float = 0.0
    finish: float = 0.0
    arrival: float = 0.0


class SimWorker:
    def __init__(self, index: int, config: SimConfig) -> None:
        self.index = index
        self.wid = f"worker-{index}"
        self.cost = config.cost
        self.block_size = config.block_size
        self.cache = BlockCache(config.capacity_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Running] = []
        self.prefilling: list[Running] = []  # admitted in the step under way
        self.busy = False
        # The prompt blocks of the waiting requests: cached by the time a new request runs.
        self.pending: dict[int, int] = {}  # hash -> waiting requests holding it

    @property
    def queued(self) -> int:
        return len(self.running) + len(self.prefilling) + len(self.waiting)

    def will_cache(self, hashes: Sequence[int]) -> int:
        """Leading blocks the worker holds or will hold once its waiting requests run."""
        n = 0
        for h in hashes:
            if h not in self.cache.blocks and h not in self.pending:
                break
            n += 1
        return n

    def enqueue(self, req: Request) -> None:
        self.waiting.append(req)
        for h in req.prompt_hashes:
            self.pending[h] = self.pending.get(h, 0) + 1

    def start_step(self, outcomes: list[Outcome], events: list[tuple[str, list[int]]]) -> float:
        """Admit what fits, return the step's duration (0: nothing to do)."""
        budget = self.cost.max_prefill_tokens
        new_tokens = 0
        while self.waiting and len(self.running) + len(self.prefilling) < self.cost.max_batch:
            req = self.waiting[0]
            matched = self.cache.match(req.prompt_hashes)
            uncached = req.prompt_len - matched * self.block_size
            if self.prefilling and new_tokens + uncached > budget:
                break
            result = self.cache.insert(req.prompt_hashes, pin=True)
            if result is None and (self.running or self.prefilling):
                break  # the KV cache is full of running requests' blocks: wait for them
            self.waiting.popleft()
            for h in req.prompt_hashes:
                if self.pending[h] == 1:
                    del self.pending[h]
                else:
                    self.pending[h] -= 1
            pinned: list[int] = []
            if result is not None:
                stored, evicted = result
                pinned = req.prompt_hashes
                if evicted:
                    events.append(("removed", evicted))
                if stored:
                    events.append(("stored", stored))
            outcomes[req.rid].cached_tokens = matched * self.block_size
            outcomes[req.rid].worker = self.index
            self.prefilling.append(Running(req, pinned))
            new_tokens += uncached
        if not self.running and not self.prefilling:
            return 0.0
        c = self.cost
        return c.step_s + c.prefill_token_s * new_tokens + c.decode_seq_s * len(self.running)

    def end_step(
        self, now: float, outcomes: list[Outcome], events: list[tuple[str, list[int]]]
    ) -> list[Request]:
        """Emit one token per running request; the finished ones."""
        for r in self.prefilling:
            outcomes[r.req.rid].first_token = now
        self.running.extend(self.prefilling)
        self.prefilling = []
        finished, still = [], []
        for r in self.running:
            r.generated += 1
            if r.generated < r.req.output_len:
                still.append(r)
                continue
            self.cache.unpin(r.pinned)
            result = self.cache.insert(r.req.full_hashes, pin=False)
            if result is not None:
                stored, evicted = result
                if evicted:
                    events.append(("removed", evicted))
                if stored:
                    events.append(("stored", stored))
            outcomes[r.req.rid].finish = now
            finished.append(r.req)
        self.running = still
        return finished


# ---- the router -------------------------------------------------------------------------


class SimClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SimRouter:
    """One router replica: `ControlPlane.pick` over simulated workers, or the oracle.

    Its own `SummaryIndex` (confirmed blocks from every worker's events, tentative entries
    from its own placements and, with `worker-announced`, the workers' pending events) and
    its own load view, as `WorkerHandle.candidate` builds it: queued = max(the worker's
    last polled load - this replica's requests ended since, this replica's in-flight
    requests there); pending prefill = this replica's routed and not yet started tokens.
    With one replica that view is exact (every request goes through it).
    """

    def __init__(
        self,
        policy: str,
        workers: list[SimWorker],
        config: SimConfig,
        clock: SimClock,
        rng: random.Random,
    ) -> None:
        self.workers = workers
        self.config = config
        self.index = SummaryIndex(config.summary_budget_bytes, clock)
        for w in workers:
            self.index.add(w.wid)
        self.rng = rng  # the oracle's and the policy's tie-breaks
        self.policy: Policy | None = None
        n = len(workers)
        self.in_flight = [0] * n
        self.pending = [0] * n  # uncached tokens routed, until the first token comes back
        self.polled = [0] * n  # the worker's running + waiting at the last poll
        self.ended_since_poll = [0] * n
        # Each worker's Candidate with nothing cached, rebuilt when its load view changes:
        # a request patches in only the workers whose summary holds its first block (as
        # `WorkerHandle.candidate` reuses an unchanged one).
        self.idle = [Candidate(w.wid, True, 0, 0, 0) for w in workers]
        self.position = {w.wid: w.index for w in workers}
        # rid -> uncached tokens when routed: the router's pending-prefill estimate, counted
        # while the request waits or prefills (the real router: until its first chunk).
        self.estimates: dict[int, int] = {}
        # At least the blocks the summaries hold: while under the budget, applying an event
        # needs no `enforce_budget` (whose size check visits every summary).
        self.blocks_bound = 0
        if policy != ORACLE:
            overrides = ABLATIONS.get(policy, {})
            options = PolicyOptions(request_cost_tokens=config.request_cost_tokens, **overrides)
            name = "cache_aware" if policy in ABLATIONS else policy
            cls = POLICIES.get(name)
            if cls is None:
                raise ValueError(f"unknown policy {policy!r}; choose from {sorted(POLICIES)}")
            self.policy = cls(rng, options)
        self.by_id = {w.wid: w for w in workers}

    def route(self, req: Request) -> SimWorker:
        if self.policy is None:
            chosen = self._oracle(req)
        else:
            matched = self.index.match(req.prompt_hashes)
            bs = self.config.block_size
            candidates = list(self.idle)
            for wid, n in matched.items():
                if n:
                    i = self.position[wid]
                    candidates[i] = candidates[i]._replace(cached_tokens=n * bs)
            chosen = self.by_id[self.policy.choose(req.prompt_len, candidates)]
            estimate = max(req.prompt_len - matched[chosen.wid] * bs, 0)
            self.estimates[req.rid] = estimate
            self.pending[chosen.index] += estimate
            self.index[chosen.wid].add_tentative(req.prompt_hashes, self.config.tentative_ttl)
            self.blocks_bound += len(req.prompt_hashes)
            self.index.enforce_budget()
        self.in_flight[chosen.index] += 1
        self._changed(chosen.index)
        return chosen

    def first_token(self, w: SimWorker, rid: int) -> None:
        self.pending[w.index] -= self.estimates.pop(rid, 0)
        self._changed(w.index)

    def ended(self, w: SimWorker) -> None:
        self.in_flight[w.index] -= 1
        self.ended_since_poll[w.index] += 1
        self._changed(w.index)

    def poll(self) -> None:
        """`WorkerHandle.poll` of every worker (GetLoad), answered at once."""
        for w in self.workers:
            self.polled[w.index] = w.queued
            self.ended_since_poll[w.index] = 0
            self._changed(w.index)

    def _changed(self, i: int) -> None:
        queued = max(self.polled[i] - self.ended_since_poll[i], self.in_flight[i])
        self.idle[i] = Candidate(self.workers[i].wid, True, 0, queued, self.pending[i])

    def _oracle(self, req: Request) -> SimWorker:
        """cache_aware's cost from the truth: true caches (+ queued prompts), exact queues."""
        per_request, bs = self.config.request_cost_tokens, self.config.block_size
        costs = [
            max(req.prompt_len - w.will_cache(req.prompt_hashes) * bs, 0) + per_request * w.queued
            for w in self.workers
        ]
        best = min(costs)
        return self.rng.choice([w for w, c in zip(self.workers, costs, strict=True) if c == best])

    def apply(self, wid: str, kind: str, hashes: list[int]) -> None:
        summary = self.index[wid]
        if kind == "stored":
            summary.store(hashes)
        elif kind == "pending":
            # The worker has the request: its prompt will be cached there (as a tentative
            # entry, it lapses unless a stored event confirms it).
            summary.add_tentative(hashes, self.config.tentative_ttl)
        else:
            summary.remove(hashes)
            return
        self.blocks_bound += len(hashes)
        if self.blocks_bound * BYTES_PER_BLOCK > self.index.budget_bytes:
            self.index.enforce_budget()
            self.blocks_bound = self.index.nbytes // BYTES_PER_BLOCK


# ---- the simulation ---------------------------------------------------------------------

_ARRIVE, _ROUTE, _STEP_END, _DELIVER, _POLL = 0, 1, 2, 3, 4


@dataclass
class Observation:
    """What `simulate` records besides the figures, when a caller asks for it."""

    placements: list[int] = field(default_factory=list)  # rid -> worker index
    replica_of: list[int] = field(default_factory=list)  # rid -> the replica that routed it
    # Per replica, each route()'s wall time and thread CPU time (which other processes of
    # a shared machine do not inflate), in microseconds.
    route_us: list[list[float]] = field(default_factory=list)
    route_cpu_us: list[list[float]] = field(default_factory=list)


def owner(req: Request, replicas: int) -> int:
    """`owner` sharing: the replica that routes every prompt starting with this block."""
    return req.prompt_hashes[0] % replicas if req.prompt_hashes else 0


def simulate(
    trace: list[Request], policy: str, config: SimConfig, observe: Observation | None = None
) -> dict[str, Any]:
    """Replay `trace` through the router replicas and workers; the figures of the run."""
    sim = Simulation(trace, policy, config)
    sim.run()
    if observe is not None:
        observe.placements = [o.worker for o in sim.outcomes]
        observe.replica_of = sim.replica_of
        observe.route_us = [[ns / 1e3 for ns in per] for per in sim.route_ns]
        observe.route_cpu_us = [[ns / 1e3 for ns in per] for per in sim.route_cpu_ns]
    return _figures(trace, sim.outcomes, config, sim.routers[0])


class Simulation:
    """The event loop: arrivals, routing decisions, worker steps, event deliveries, polls.

    Requests go to the replicas round robin, from a seeded first replica (with `owner`
    sharing, a request that lands on a replica other than its prefix's owner is forwarded
    there, `forward_s` later). Every worker event reaches every replica `event_delay_s`
    after the worker published it; each replica polls every worker's load once per
    `health_interval_s` (the replicas' polls spread over the interval).
    """

    def __init__(self, trace: list[Request], policy: str, config: SimConfig) -> None:
        self.config = config
        self.clock = SimClock()
        self.workers = [SimWorker(i, config) for i in range(config.workers)]
        # The replicas draw their tie-breaks from one seeded stream, in decision order: as
        # random as a stream each, and a run with several replicas takes the same draws as
        # one router's, so the two differ only where the replicas' views do.
        rng = random.Random(config.seed)
        self.routers = [
            SimRouter(policy, self.workers, config, self.clock, rng) for _ in range(config.replicas)
        ]
        self.trace = trace
        self.outcomes = [Outcome() for _ in trace]
        self.replica_of = [0] * len(trace)
        self.next_turn = {r.after: r for r in trace if r.after is not None}
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.turn = random.Random(config.seed).randrange(config.replicas)  # the next replica
        self.unfinished = len(trace)
        self.route_ns: list[list[int]] = [[] for _ in self.routers]
        self.route_cpu_ns: list[list[int]] = [[] for _ in self.routers]

    def run(self) -> None:
        config = self.config
        for r in self.trace:
            if r.after is None:
                self.push(r.arrival, _ARRIVE, r)
        if config.replicas > 1:  # one router's poll cannot change its view (see SimRouter)
            for i in range(config.replicas):
                self.push(i * config.health_interval_s / config.replicas, _POLL, i)
        handlers: dict[int, Callable[[float, Any], None]] = {
            _ARRIVE: self._arrive,
            _ROUTE: self._route,
            _STEP_END: self._step_end,
            _DELIVER: self._deliver,
            _POLL: self._poll,
        }
        heap = self.heap
        while heap:
            now, _, kind, payload = heapq.heappop(heap)
            self.clock.now = now
            handlers[kind](now, payload)

    def push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self.heap, (t, self.seq, kind, payload))
        self.seq += 1

    def _arrive(self, now: float, req: Request) -> None:
        self.outcomes[req.rid].arrival = now
        replica, replicas = self.turn, self.config.replicas
        self.turn = (self.turn + 1) % replicas
        if self.config.sharing == "owner" and owner(req, replicas) != replica:
            self.push(now + self.config.forward_s, _ROUTE, (req, owner(req, replicas)))
        else:
            self._route(now, (req, replica))

    def _route(self, now: float, payload: tuple[Request, int]) -> None:
        req, replica = payload
        self.replica_of[req.rid] = replica
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        w = self.routers[replica].route(req)
        self.route_ns[replica].append(time.perf_counter_ns() - t0)
        self.route_cpu_ns[replica].append(time.thread_time_ns() - c0)
        if self.config.sharing == "worker-announced":
            self.push(
                now + self.config.event_delay_s, _DELIVER, (w.wid, "pending", req.prompt_hashes)
            )
        w.enqueue(req)
        if not w.busy:
            self._start(w, now)

    def _start(self, w: SimWorker, now: float) -> None:
        events: list[tuple[str, list[int]]] = []
        duration = w.start_step(self.outcomes, events)
        # Evictions happen at admission; the worker publishes them right away.
        self._publish(w, now, events)
        w.busy = duration > 0
        if w.busy:
            self.push(now + duration, _STEP_END, w)

    def _step_end(self, now: float, w: SimWorker) -> None:
        for r in w.prefilling:
            self.routers[self.replica_of[r.req.rid]].first_token(w, r.req.rid)
        events: list[tuple[str, list[int]]] = []
        for done in w.end_step(now, self.outcomes, events):
            self.routers[self.replica_of[done.rid]].ended(w)
            self.unfinished -= 1
            follow = self.next_turn.get(done.rid)
            if follow is not None:
                self.push(now + follow.arrival, _ARRIVE, follow)
        self._publish(w, now, events)
        self._start(w, now)

    def _publish(self, w: SimWorker, now: float, events: list[tuple[str, list[int]]]) -> None:
        for kind, hashes in events:
            self.push(now + self.config.event_delay_s, _DELIVER, (w.wid, kind, hashes))

    def _deliver(self, now: float, payload: tuple[str, str, list[int]]) -> None:
        wid, kind, hashes = payload
        for router in self.routers:
            router.apply(wid, kind, hashes)

    def _poll(self, now: float, replica: int) -> None:
        if self.unfinished:  # repeated while anything is left to route or run
            self.routers[replica].poll()
            self.push(now + self.config.health_interval_s, _POLL, replica)


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def _figures(
    trace: list[Request], outcomes: list[Outcome], config: SimConfig, router: SimRouter
) -> dict[str, Any]:
    prompt = sum(r.prompt_len for r in trace)
    cached = sum(o.cached_tokens for o in outcomes)
    ttft = [o.first_token - o.arrival for o in outcomes]
    makespan = max(o.finish for o in outcomes) - min(o.arrival for o in outcomes)
    per_worker = [0] * config.workers
    for o in outcomes:
        per_worker[o.worker] += 1
    return {
        "requests": len(trace),
        "hit_rate": cached / prompt,
        "throughput_rps": len(trace) / makespan,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "makespan_s": makespan,
        "max_worker_share": max(per_worker) / len(trace),  # 1/W is perfectly even
        "summary_blocks": sum(len(s) for s in router.index.summaries.values()),
    }
