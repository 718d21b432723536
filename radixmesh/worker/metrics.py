"""The worker's Prometheus metrics: scheduler stats as gauges/counters, latency histograms.

Gauges and counters are read from `SchedulerStats` at scrape time (a custom collector),
so the scheduler keeps plain counters and knows nothing of Prometheus. The server
observes the latency histograms per request. Names follow Prometheus conventions
(`radixmesh_` prefix, base units, `_total` counters); bucket boundaries are vLLM's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixmesh.worker.stats import SchedulerStats

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class _StatsCollector(Collector):
    def __init__(self, read: Callable[[], SchedulerStats | None]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        s = self.read()
        if s is None:  # the model is still loading
            return
        yield GaugeMetricFamily(
            "radixmesh_num_requests_running", "Requests in the running batch.", s.num_running
        )
        yield GaugeMetricFamily(
            "radixmesh_num_requests_waiting", "Requests waiting for admission.", s.num_waiting
        )
        ratio = s.kv_slots_used / s.kv_slots_total if s.kv_slots_total else 0.0
        yield GaugeMetricFamily(
            "radixmesh_kv_cache_usage_ratio",
            "Fraction of KV slots held by requests or the radix cache.",
            ratio,
        )
        counters = (
            ("radixmesh_prefix_cache_queries", "Prompt tokens looked up in the radix cache.",
             s.prompt_tokens),
            ("radixmesh_prefix_cache_hits", "Prompt tokens served from the radix cache.",
             s.cache_hit_tokens),
            ("radixmesh_prompt_tokens", "Prompt tokens admitted.", s.prompt_tokens),
            ("radixmesh_generation_tokens", "Tokens generated.", s.generated_tokens),
            ("radixmesh_num_preemptions", "Requests retracted to free KV memory.",
             s.num_retractions),
            ("radixmesh_constrained_requests", "Requests with a regex/JSON/EBNF/choices rule.",
             s.constrained_requests),
            ("radixmesh_jump_forward_tokens",
             "Output tokens a grammar forced, appended without a decode step.",
             s.jump_forward_tokens),
        )  # fmt: skip
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)


class WorkerMetrics:
    """One registry per worker (tests run several in one process)."""

    def __init__(self, read_stats: Callable[[], SchedulerStats | None]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StatsCollector(read_stats))
        self.ttft = Histogram(
            "radixmesh_time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "radixmesh_inter_token_latency_seconds",
            "Time between two generated tokens of one request.",
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "radixmesh_e2e_request_latency_seconds",
            "Time from arrival to the last token.",
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Expose /metrics on host:port (a daemon thread)."""
        start_http_server(port, addr=host, registry=self.registry)
