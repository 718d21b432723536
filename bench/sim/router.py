"""A simulated router replica over the real policies and summaries."""

from __future__ import annotations

import random

from bench.sim.config import ABLATIONS, ORACLE, Request, SimConfig
from bench.sim.worker import SimWorker
from radixmesh.router.hot import HotPrefixConfig, HotPrefixes, place
from radixmesh.router.policy import POLICIES, Candidate, Policy, PolicyOptions
from radixmesh.router.summary import BYTES_PER_BLOCK, SummaryIndex


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

    With `load_sharing` "worker-announced" it also counts the other replicas' requests on
    each worker, as `WorkerHandle` does from the worker's request events: one from the
    event announcing its arrival to the one announcing its end, its prompt's blocks that
    this replica's summary lacked at its arrival as pending prefill until its first token,
    weighed at `shared_pending_weight` (docs/router-sim.md: at full weight, 8 replicas
    acting on the same view an event delay old herd onto the same workers).
    """

    def __init__(
        self,
        policy: str,
        workers: list[SimWorker],
        config: SimConfig,
        clock: SimClock,
        rng: random.Random,
        index: int = 0,
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
        # The other replicas' requests per worker, from the worker's request events:
        # rid -> its pending-prefill estimate (0 once its first token came).
        self.others: list[dict[int, int]] = [{} for _ in range(n)]
        self.others_pending = [0] * n
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
            partition = (index, config.replicas) if config.partition_cold else (0, 1)
            options = PolicyOptions(
                request_cost_tokens=config.request_cost_tokens,
                host_hit_cost=config.host_hit_cost,
                cold_partition=partition,
                **overrides,
            )
            name = "cache_aware" if policy in ABLATIONS else policy
            cls = POLICIES.get(name)
            if cls is None:
                raise ValueError(f"unknown policy {policy!r}; choose from {sorted(POLICIES)}")
            self.policy = cls(rng, options)
        self.by_id = {w.wid: w for w in workers}
        self.hot = HotPrefixes(HotPrefixConfig()) if config.hot_prefixes else None

    def route(self, req: Request) -> SimWorker:
        if self.policy is None:
            chosen = self._oracle(req)
        else:
            bs = self.config.block_size
            candidates = list(self.idle)
            if self.config.host_capacity_tokens:  # workers with a host tier: tiered matches
                tiers = self.index.match_tiers(req.prompt_hashes)
                for wid, (n, host) in tiers.items():
                    if n or host:
                        i = self.position[wid]
                        candidates[i] = candidates[i]._replace(
                            cached_tokens=n * bs, host_cached_tokens=host * bs
                        )
                matched = {wid: n + host for wid, (n, host) in tiers.items()}
            else:
                matched = self.index.match(req.prompt_hashes)
                for wid, n in matched.items():
                    if n:
                        i = self.position[wid]
                        candidates[i] = candidates[i]._replace(cached_tokens=n * bs)
            chosen = self.by_id[self.policy.choose(req.prompt_len, candidates)]
            if self.hot is not None:
                chosen = self._hot(req, candidates, chosen)
            # As `Placement.cached`: the tokens reloaded from host memory are not prefilled.
            estimate = max(req.prompt_len - matched[chosen.wid] * bs, 0)
            self.estimates[req.rid] = estimate
            self.pending[chosen.index] += estimate
            self.index[chosen.wid].add_tentative(req.prompt_hashes, self.config.tentative_ttl)
            self.blocks_bound += len(req.prompt_hashes)
            self.index.enforce_budget()
        self.in_flight[chosen.index] += 1
        self._changed(chosen.index)
        return chosen

    def _hot(self, req: Request, candidates: list[Candidate], chosen: SimWorker) -> SimWorker:
        """`ControlPlane.pick`'s hot-prefix step: a hot prefix's request goes where
        cache_aware's cost is least with its homes counted as caching the prompt and
        every other worker at `new_home_prefill` of its prefill (a new home)."""
        assert self.hot is not None and self.policy is not None
        key = self.hot.key(req.prompt_hashes)
        if key is None:
            return chosen
        wid = place(
            self.hot, self.policy, key, self.index.clock(), req.prompt_len, candidates, chosen.wid
        )
        return self.by_id[wid]

    def first_token(self, w: SimWorker, rid: int) -> None:
        self.pending[w.index] -= self.estimates.pop(rid, 0)
        self._changed(w.index)

    def ended(self, w: SimWorker) -> None:
        if self.hot is not None:
            self.hot.finished(w.wid, self.index.clock())
        self.in_flight[w.index] -= 1
        self.ended_since_poll[w.index] += 1
        self._changed(w.index)

    def announced(self, w: SimWorker, req: Request) -> None:
        """Another replica's request arrived at `w` (the worker's event): counted queued,
        and the blocks this replica's summary of `w` lacks as its pending prefill."""
        hashes = req.prompt_hashes
        missing = len(hashes) - self.index[w.wid].match(hashes)
        estimate = missing * self.config.block_size
        self.others[w.index][req.rid] = estimate
        self.others_pending[w.index] += estimate
        self._changed(w.index)

    def started_elsewhere(self, w: SimWorker, rid: int) -> None:
        """Another replica's request on `w` produced its first token (the worker's event)."""
        others = self.others[w.index]
        estimate = others.get(rid)
        if estimate:
            self.others_pending[w.index] -= estimate
            others[rid] = 0
            self._changed(w.index)

    def ended_elsewhere(self, w: SimWorker, rid: int) -> None:
        """Another replica's request on `w` ended (the worker's event)."""
        estimate = self.others[w.index].pop(rid, None)
        if estimate is not None:
            self.others_pending[w.index] -= estimate
            self.ended_since_poll[w.index] += 1
            self._changed(w.index)

    def poll(self) -> None:
        """`WorkerHandle.poll` of every worker (GetLoad), answered at once."""
        for w in self.workers:
            self.polled[w.index] = w.queued
            self.ended_since_poll[w.index] = 0
            self._changed(w.index)

    def _changed(self, i: int) -> None:
        tracked = self.in_flight[i] + len(self.others[i])
        queued = max(self.polled[i] - self.ended_since_poll[i], tracked)
        pending = self.pending[i]
        if self.others_pending[i]:
            pending += int(self.config.shared_pending_weight * self.others_pending[i])
        self.idle[i] = Candidate(self.workers[i].wid, True, 0, queued, pending)

    def _oracle(self, req: Request) -> SimWorker:
        """cache_aware's cost from the truth: true caches (+ queued prompts; the host tiers,
        at `host_hit_cost`), exact queues."""
        per_request, bs = self.config.request_cost_tokens, self.config.block_size
        costs = []
        for w in self.workers:
            cached = w.will_cache(req.prompt_hashes)
            host = w.will_reload(req.prompt_hashes, cached) * bs
            cost = max(req.prompt_len - cached * bs - host, 0) + per_request * w.queued
            costs.append(cost + self.config.host_hit_cost * host if host else cost)
        best = min(costs)
        return self.rng.choice([w for w, c in zip(self.workers, costs, strict=True) if c == best])

    def apply(self, wid: str, kind: str, hashes: list[int]) -> None:
        summary = self.index[wid]
        if kind == "stored" or kind == "loaded":
            summary.store(hashes)
        elif kind == "offloaded":
            summary.offload(hashes)
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
