"""The discrete-event loop over workers and router replicas, and its figures."""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.sim.config import Request, SimConfig
from bench.sim.router import SimClock, SimRouter
from bench.sim.worker import Outcome, SimWorker

_ARRIVE, _ROUTE, _STEP_END, _DELIVER, _POLL, _REQUEST_EVENT = 0, 1, 2, 3, 4, 5


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
            SimRouter(policy, self.workers, config, self.clock, rng, i)
            for i in range(config.replicas)
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
            _REQUEST_EVENT: self._request_event,
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
        # Before the pending event (same time, pushed first): a replica estimates the
        # request's prefill from its summary as it was before the announcement.
        self._announce(w, now, "arrived", req)
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
            self._announce(w, now, "started", r.req)
        events: list[tuple[str, list[int]]] = []
        for done in w.end_step(now, self.outcomes, events):
            self.routers[self.replica_of[done.rid]].ended(w)
            self._announce(w, now, "ended", done)
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

    def _announce(self, w: SimWorker, now: float, kind: str, req: Request) -> None:
        """With shared load, the worker's event about one request (its arrival, first
        token, end), reaching every replica an event delay later."""
        if self.config.load_sharing == "worker-announced" and len(self.routers) > 1:
            self.push(now + self.config.event_delay_s, _REQUEST_EVENT, (w, kind, req))

    def _request_event(self, now: float, payload: tuple[SimWorker, str, Request]) -> None:
        w, kind, req = payload
        own = self.replica_of[req.rid]
        for i, router in enumerate(self.routers):
            if i == own:
                continue  # its own request: counted from its decision to its end
            if kind == "arrived":
                router.announced(w, req)
            elif kind == "started":
                router.started_elsewhere(w, req.rid)
            else:
                router.ended_elsewhere(w, req.rid)

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
    host_cached = sum(o.host_cached_tokens for o in outcomes)
    ttft = [o.first_token - o.arrival for o in outcomes]
    makespan = max(o.finish for o in outcomes) - min(o.arrival for o in outcomes)
    per_worker = [0] * config.workers
    for o in outcomes:
        per_worker[o.worker] += 1
    return {
        "requests": len(trace),
        "hit_rate": cached / prompt,  # on the device
        "host_hit_rate": host_cached / prompt,  # reloaded from host memory
        "throughput_rps": len(trace) / makespan,
        "goodput_rps": sum(1 for t in ttft if t <= config.ttft_slo_s) / makespan,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "makespan_s": makespan,
        "max_worker_share": max(per_worker) / len(trace),  # 1/W is perfectly even
        "summary_blocks": sum(len(s) for s in router.index.summaries.values()),
    }
