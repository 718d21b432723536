"""The router's Prometheus metrics (`radixmesh_router_*`, base units, `_total` counters).

Events are counted as they happen (requests per front end, endpoint and status; routing
decisions per policy and worker; prompt and cached prompt tokens, and those cached in a
worker's host memory; retries; the routing decision latency). The worker pool's state
(breakers, health, requests in flight, summary sizes) is read at scrape time by a custom
collector, so the pool keeps plain fields and knows nothing of Prometheus.

Statuses are gRPC status names on both front ends (an HTTP 429 counts as
RESOURCE_EXHAUSTED), so one query covers gRPC and HTTP clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from radixmesh.router.breaker import BreakerState
from radixmesh.router.hot import HotPrefixStats
from radixmesh.router.summary import BYTES_PER_BLOCK

if TYPE_CHECKING:
    from radixmesh.router.admission import Admission, RateLimiter
    from radixmesh.router.pool import WorkerPool

# A routing decision matches a prompt against every summary: microseconds to milliseconds.
DECISION_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1,
)  # fmt: skip
BREAKER_STATES: tuple[BreakerState, ...] = get_args(BreakerState)
# Seen by a client of the router: the worker's latency plus routing and proxying.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass
class RequestRecord:
    """What a front end learns about one request; its status is counted when it ends."""

    status: str = "OK"


class _PoolCollector(Collector):
    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        workers = list(self.pool.workers.values())
        breaker = GaugeMetricFamily(
            "radixmesh_router_worker_breaker_state",
            "1 for the state each worker's circuit breaker is in, 0 for the others.",
            labels=["worker", "state"],
        )
        healthy = GaugeMetricFamily(
            "radixmesh_router_worker_healthy",
            "1 if the worker answers health polls and its breaker lets requests through.",
            labels=["worker"],
        )
        in_flight = GaugeMetricFamily(
            "radixmesh_router_worker_requests_in_flight",
            "Requests the router has on each worker now.",
            labels=["worker"],
        )
        pending = GaugeMetricFamily(
            "radixmesh_router_worker_pending_prefill_tokens",
            "Uncached prompt tokens of the router's requests on each worker that have not "
            "streamed yet (cache_aware weighs them).",
            labels=["worker"],
        )
        others = GaugeMetricFamily(
            "radixmesh_router_worker_other_replicas_requests",
            "Requests other router replicas have on each worker, from its request events "
            "(weighed in routing behind several replicas; router/pool.py).",
            labels=["worker"],
        )
        slow = CounterMetricFamily(
            "radixmesh_router_worker_slow_health_polls",
            "Health polls that timed out while the worker was heard from on another channel "
            "(output, cache events): counted busy, not down (router/liveness.py).",
            labels=["worker"],
        )
        blocks = GaugeMetricFamily(
            "radixmesh_router_prefix_index_blocks",
            "Prefix blocks in each worker's summary (confirmed and tentative).",
            labels=["worker"],
        )
        grammars = GaugeMetricFamily(
            "radixmesh_router_worker_grammars",
            "Grammars each worker announced it has compiled (cache_aware's grammar affinity).",
            labels=["worker"],
        )
        for w in workers:
            state = w.breaker.state
            for s in BREAKER_STATES:
                breaker.add_metric([w.worker_id, s], 1.0 if s == state else 0.0)
            healthy.add_metric([w.worker_id], 1.0 if w.healthy else 0.0)
            in_flight.add_metric([w.worker_id], w.in_flight)
            pending.add_metric([w.worker_id], w.pending_prefill)
            others.add_metric([w.worker_id], len(w.others))
            slow.add_metric([w.worker_id], w.slow_polls)
            blocks.add_metric([w.worker_id], len(w.summary))
            grammars.add_metric([w.worker_id], len(w.grammars))
        yield from (breaker, healthy, in_flight, pending, others, slow, blocks, grammars)
        yield GaugeMetricFamily(
            "radixmesh_router_prefix_index_bytes",
            f"Accounted memory of every summary together ({BYTES_PER_BLOCK} bytes per block).",
            value=self.pool.index.nbytes,
        )
        yield CounterMetricFamily(
            "radixmesh_router_prefix_index_forgotten_blocks",
            "Summary blocks dropped to keep within the byte budget.",
            value=self.pool.index.forgotten_blocks,
        )
        # Hot-prefix replication (0 while off): read from its own counts, so a home dropped
        # with its worker leaving the pool moves the gauge without a counter of its own.
        stats = self.pool.hot.stats if self.pool.hot is not None else HotPrefixStats()
        yield GaugeMetricFamily(
            "radixmesh_router_hot_prefixes",
            "Prefixes with more than one home worker now (--hot-prefix-replication).",
            value=stats.hot,
        )
        yield CounterMetricFamily(
            "radixmesh_router_hot_prefix_homes_added",
            "Homes given to hot prefixes (a worker added to a prefix's homes).",
            value=stats.replications,
        )
        yield CounterMetricFamily(
            "radixmesh_router_hot_prefix_homes_removed",
            "Homes taken from prefixes as they cooled (their last-added one each time).",
            value=stats.dereplications,
        )


class _AdmissionCollector(Collector):
    def __init__(self, admission: Admission, rate: RateLimiter) -> None:
        self.admission = admission
        self.rate = rate

    def collect(self) -> Iterator[Metric]:
        a = self.admission
        yield GaugeMetricFamily(
            "radixmesh_router_admitted_requests",
            "Requests holding an admission slot (on a worker now).",
            value=a.active,
        )
        yield GaugeMetricFamily(
            "radixmesh_router_queued_requests",
            "Requests waiting for an admission slot.",
            value=a.waiting,
        )
        refused = CounterMetricFamily(
            "radixmesh_router_refused_requests",
            "Requests refused before any worker saw them (429), by reason.",
            labels=["reason"],
        )
        refused.add_metric(["queue"], a.refused)
        refused.add_metric(["rate_limit"], self.rate.refused)
        yield refused


class RouterMetrics:
    """One registry per router (tests run several in one process)."""

    def __init__(self, pool: WorkerPool) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_PoolCollector(pool))
        r = self.registry
        self.requests = Counter(
            "radixmesh_router_requests",
            "Requests that ended, by front end, endpoint and gRPC status name.",
            ["frontend", "endpoint", "status"],
            registry=r,
        )
        self.in_flight = Gauge(
            "radixmesh_router_requests_in_flight", "Requests the front ends serve now.", registry=r
        )
        self.decisions = Counter(
            "radixmesh_router_routing_decisions",
            "Routing decisions, by policy and chosen worker.",
            ["policy", "worker"],
            registry=r,
        )
        self.decision_seconds = Histogram(
            "radixmesh_router_routing_decision_seconds",
            "Time to choose a worker for one prompt (summary matches and the policy).",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "radixmesh_router_prompt_tokens",
            "Prompt tokens of finished generations, as the workers report them.",
            registry=r,
        )
        self.cached_tokens = Counter(
            "radixmesh_router_cached_prompt_tokens",
            "Prompt tokens the workers served from their radix caches.",
            registry=r,
        )
        self.host_cached_tokens = Counter(
            "radixmesh_router_host_cached_prompt_tokens",
            "Prompt tokens of routed prompts that the chosen worker held only in host memory "
            "(reloaded, not prefilled), as its summary said when routing (retries included).",
            registry=r,
        )
        self.retries = Counter(
            "radixmesh_router_retries",
            "Requests sent to another worker after one failed before the first token.",
            registry=r,
        )
        self.ttft = Histogram(
            "radixmesh_router_time_to_first_token_seconds",
            "Time from routing a generation to the first chunk a worker streamed back "
            "(retries included).",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "radixmesh_router_e2e_request_latency_seconds",
            "Time from routing a generation to its last chunk (retries included).",
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.worker_requests = Counter(
            "radixmesh_router_worker_requests",
            "Generations sent to each worker that ended, by gRPC status name (a retried "
            "attempt counts on the worker that failed it).",
            ["worker", "status"],
            registry=r,
        )

    @contextmanager
    def request(self, frontend: str, endpoint: str) -> Iterator[RequestRecord]:
        """Count a request in flight, then by the status the caller set on the record.

        An exception that escapes with the status still OK counts as CANCELLED (the
        client went away) or INTERNAL.
        """
        record = RequestRecord()
        self.in_flight.inc()
        try:
            yield record
        except BaseException as e:
            if record.status == "OK":
                cancelled = isinstance(e, (GeneratorExit, asyncio.CancelledError))
                record.status = "CANCELLED" if cancelled else "INTERNAL"
            raise
        finally:
            self.in_flight.dec()
            self.requests.labels(frontend, endpoint, record.status).inc()

    def watch_admission(self, admission: Admission, rate: RateLimiter) -> None:
        """Export the admission queue and the rate limiter (router/admission.py)."""
        self.registry.register(_AdmissionCollector(admission, rate))

    def exposition(self) -> bytes:
        """The text format, as /metrics serves it."""
        return bytes(generate_latest(self.registry))

    def serve(self, port: int, host: str = "0.0.0.0") -> Any:
        """Expose /metrics on host:port (a daemon thread). Returns the server (shutdown())."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
