"""Routing policies behind a registry.

A policy sees one `Candidate` per worker (healthy or not) and returns the chosen worker's
id. Rules every policy keeps: never choose an unhealthy candidate; raise `Unavailable`
when none is healthy; draw every random choice from the `random.Random` it was built with
(so a seeded router routes reproducibly).
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from radixmesh.errors import InvalidArgument, Unavailable


class Candidate(NamedTuple):
    """One worker as a policy sees it (a NamedTuple: the router builds one per worker per
    request, and a frozen dataclass costs ~1 us each to build, 64 us at 64 workers)."""

    worker_id: str
    healthy: bool
    cached_tokens: int  # prompt tokens the worker's summary says it caches
    queued: int  # requests running or waiting on the worker (its report or ours, the larger)
    # Prompt tokens the router sent to the worker that it has not prefilled yet (each
    # request's uncached tokens when it was routed, until its first token comes back).
    pending_prefill: int = 0
    # Prompt tokens right after the cached ones that the worker holds only in host memory:
    # reloaded, not prefilled (the worker's host KV tier).
    host_cached_tokens: int = 0
    # The worker has the request's grammar compiled (it announced its key; grammar_key.py).
    has_grammar: bool = False


@dataclass(frozen=True)
class PolicyOptions:
    request_cost_tokens: int = 64  # cache_aware: a queued request's cost in prefill tokens
    # cache_aware: weight of the prefill work already waiting on a worker. A new request
    # waits for it (its time to first token grows with it) even where it hits the cache.
    pending_prefill_weight: float = 0.5
    # cache_aware: the cost of a prompt token held in a worker's host memory, relative to
    # prefilling it (1.0: a host hit counts as a miss, the policy is tier-blind). Reloading
    # moves an 8B model's ~128 KiB of KV per token over PCIe at ~30 GB/s: ~4 us a token,
    # and the copy overlaps compute, against ~25-40 us a token of prefill on an H200 at
    # the batch sizes a router sees. 0.2 leaves room for the copy's overheads and for
    # small models, whose prefill is cheaper per byte of KV.
    host_hit_cost: float = 0.2
    # cache_aware behind several router replicas: (this replica's index, the replicas). A
    # prompt that no worker caches any of goes to this replica's share of the workers
    # (every `replicas`-th by sorted id, from `index`): a replica sees its own placements
    # at once and the others' an event delay later, so replicas choosing among all workers
    # on the same view herd their cold prefills onto the same least-loaded one
    # (docs/router-sim.md). (0, 1): one router, every worker.
    cold_partition: tuple[int, int] = (0, 1)
    # cache_aware behind several replicas: what a worker outside this replica's share that
    # caches none of the prompt costs more, in prefills of the prompt. A cold prompt leaves
    # the share only when every worker in it is busier than one outside by more than that:
    # a share of 8 workers (64 workers, 8 replicas) is too few to even out a burst of cold
    # prompts on its own, and a margin of one prefill is more than the others' unseen
    # placements make a worker look idle. Below ~0.9 the replicas herd again, from ~1.5
    # it is a hard partition (docs/router-sim.md, "Soft shares").
    off_share_prefills: float = 1.0
    # cache_aware: what a worker holding the request's grammar compiled is worth, in
    # prefill tokens (grammar affinity; 0: off). Small on purpose, below one queued
    # request's cost: it breaks ties and near-ties between workers, never outweighs a
    # cache hit of more than a block or two or a busier queue. A compile takes a CPU core
    # (~5 ms for a small JSON schema over a 49k vocabulary, seconds for a large one) and
    # delays its request's first token by that; without affinity the requests of one
    # schema spread over tied workers and compile it on each.
    grammar_affinity_tokens: int = 32

    def __post_init__(self) -> None:
        if self.grammar_affinity_tokens < 0:
            raise InvalidArgument(
                "grammar_affinity_tokens", f"must be >= 0, got {self.grammar_affinity_tokens}"
            )
        if not 0.0 <= self.host_hit_cost <= 1.0:
            raise InvalidArgument("host_hit_cost", f"must be in [0, 1], got {self.host_hit_cost}")
        if not 0.0 <= self.off_share_prefills < math.inf:
            raise InvalidArgument(
                "off_share_prefills", f"must be finite and >= 0, got {self.off_share_prefills}"
            )
        index, replicas = self.cold_partition
        if replicas < 1 or not 0 <= index < replicas:
            raise InvalidArgument(
                "cold_partition",
                f"want (index, replicas) with 0 <= index < replicas, got {self.cold_partition}",
            )


class Policy(ABC):
    name = ""

    def __init__(self, rng: random.Random, options: PolicyOptions) -> None:
        self.rng = rng
        self.options = options

    @abstractmethod
    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> str:
        """The id of the worker to send a prompt of `prompt_tokens` tokens to."""

    def _healthy(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        healthy = [c for c in candidates if c.healthy]
        if not healthy:
            raise Unavailable("no healthy worker to route to")
        return healthy

    def _min(self, candidates: Sequence[Candidate], key: Callable[[Candidate], float]) -> str:
        """The candidate with the smallest key; ties broken at random."""
        keys = [key(c) for c in candidates]
        best = min(keys)
        ties = [c for c, k in zip(candidates, keys, strict=True) if k == best]
        return self.rng.choice(ties).worker_id


class CacheAware(Policy):
    """Cost = prompt tokens the worker must prefill + host_hit_cost x the prompt tokens it
    reloads from host memory + pending_prefill_weight x the prefill tokens already waiting
    there + request_cost_tokens per queued request.

    The last two terms are the load: a hot prefix's requests stay on the worker caching it
    until its queue costs more than prefilling the prefix elsewhere, then spill over (the
    router simulator's `hot` trace; docs/router-sim.md).

    Grammar affinity: a worker that has the request's grammar compiled (`has_grammar`)
    costs `grammar_affinity_tokens` less. So among workers whose costs are equal or within
    that tolerance of each other, one that holds the grammar wins, and a request whose
    prompt no worker caches (all cost the same but for their load) goes where its grammar
    is, unless that worker is busier by more than the tolerance. Requests with the same
    schema then compile it on one worker, not on every tied worker they land on.

    Behind several replicas (`cold_partition`), a worker that caches none of the prompt
    costs `off_share_prefills` x the prompt's tokens more unless it is in this replica's
    share or holds the request's grammar (a grammar's requests gather on its holders, not
    on one least-loaded worker: the herding the shares prevent). So a cold prompt, or a
    warm one spilling off its holders, stays in the share unless the whole share is
    busier by more than that; with no healthy worker in the share, it goes elsewhere."""

    name = "cache_aware"

    def __init__(self, rng: random.Random, options: PolicyOptions) -> None:
        super().__init__(rng, options)
        self._ids: tuple[str, ...] = ()  # the worker ids `_share` was computed for
        self._share: frozenset[str] = frozenset()

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> str:
        share = self._share_of(candidates) if self.options.cold_partition[1] > 1 else None
        chosen = self._cheapest(prompt_tokens, candidates, share)
        if chosen is None:
            raise Unavailable("no healthy worker to route to")
        return chosen

    def _share_of(self, candidates: Sequence[Candidate]) -> frozenset[str]:
        """This replica's share of the workers: every `replicas`-th by sorted id."""
        ids = tuple(c.worker_id for c in candidates)
        if ids != self._ids:
            index, replicas = self.options.cold_partition
            self._ids, self._share = ids, frozenset(sorted(ids)[index::replicas])
        return self._share

    def _cheapest(
        self, prompt_tokens: int, candidates: Sequence[Candidate], share: frozenset[str] | None
    ) -> str | None:
        # Plain loops, no per-candidate calls: the router runs this for every request over
        # every worker. Same result and random draws as `_min(_healthy(...), cost)`.
        o = self.options
        pending_weight, per_request = o.pending_prefill_weight, o.request_cost_tokens
        off_share = o.off_share_prefills * prompt_tokens
        best = float("inf")
        ties: list[str] = []
        for worker_id, healthy, cached_tokens, queued, pending, host, grammar in candidates:
            if not healthy:
                continue
            cost = (
                max(prompt_tokens - cached_tokens - host, 0)
                + pending_weight * pending
                + per_request * queued
            )
            if (
                share is not None
                and not (cached_tokens or host or grammar)
                and worker_id not in share
            ):
                cost += off_share
            if host:  # (a separate term: without host hits the sum is as it always was)
                cost += o.host_hit_cost * host
            if grammar:
                cost -= o.grammar_affinity_tokens
            if cost < best:
                best, ties = cost, [worker_id]
            elif cost == best:
                ties.append(worker_id)
        return self.rng.choice(ties) if ties else None


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self, rng: random.Random, options: PolicyOptions) -> None:
        super().__init__(rng, options)
        self._next = 0

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> str:
        healthy = self._healthy(candidates)
        choice = healthy[self._next % len(healthy)]
        self._next += 1
        return choice.worker_id


class LeastLoad(Policy):
    name = "least_load"

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> str:
        return self._min(self._healthy(candidates), lambda c: c.queued)


class PowerOfTwo(Policy):
    """Two healthy workers drawn at random; the less loaded one."""

    name = "power_of_two"

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> str:
        healthy = self._healthy(candidates)
        pair = self.rng.sample(healthy, min(2, len(healthy)))
        return self._min(pair, lambda c: c.queued)


class Random(Policy):
    name = "random"

    def choose(self, prompt_tokens: int, candidates: Sequence[Candidate]) -> str:
        return self.rng.choice(self._healthy(candidates)).worker_id


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (CacheAware, RoundRobin, LeastLoad, PowerOfTwo, Random)
}


def make_policy(name: str, seed: int | None = None, options: PolicyOptions | None = None) -> Policy:
    cls = POLICIES.get(name)
    if cls is None:
        raise InvalidArgument("policy", f"unknown policy {name!r}; choose from {sorted(POLICIES)}")
    return cls(random.Random(seed), options or PolicyOptions())
