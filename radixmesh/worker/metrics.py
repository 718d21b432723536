"""The worker's Prometheus metrics: scheduler stats as gauges/counters, per-request histograms.

Gauges and counters are read from `SchedulerStats` at scrape time (a custom collector),
so the scheduler keeps plain counters and knows nothing of Prometheus. The server
observes the per-request histograms: latencies as chunks stream, and on the final chunk
the phases the engine timed (`MetaInfo.queue_time`, `prefill_time`, `decode_time`),
the prompt and generation lengths and the finish reason. Names follow Prometheus
conventions (`radixmesh_` prefix, base units, `_total` counters); every series carries
`model_name` (the served model name), so one dashboard can tell models apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from radixmesh.worker.request_output import MetaInfo
from radixmesh.worker.stats import SchedulerStats

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
# From 1 ms: a GPU decode step takes a few milliseconds, and buckets that start at 10 ms
# would put every sample in the first one.
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# Queue, prefill and decode phases: from a millisecond (an idle GPU) to an hour.
PHASE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 3600.0,
)  # fmt: skip
# Token counts, 1-2-5 steps up to 200k (longer prompts land in +Inf).
LENGTH_BUCKETS = tuple(
    float(m * 10**e) for e in range(6) for m in (1, 2, 5) if m * 10**e <= 200_000
)
FINISH_REASONS = ("stop", "length", "abort")
MODEL_LABEL = "model_name"


class _StatsCollector(Collector):
    def __init__(self, read: Callable[[], SchedulerStats | None], model_name: str) -> None:
        self.read = read
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        s = self.read()
        if s is None:  # the model is still loading
            return
        gauges = (
            ("radixmesh_num_requests_running", "Requests in the running batch.", s.num_running),
            ("radixmesh_num_requests_waiting", "Requests waiting for admission.", s.num_waiting),
            ("radixmesh_kv_cache_usage_ratio",
             "Fraction of KV slots held by requests or the radix cache.",
             s.kv_slots_used / s.kv_slots_total if s.kv_slots_total else 0.0),
            ("radixmesh_kv_cache_capacity_tokens", "Tokens the KV pool can hold.",
             s.kv_slots_total),
            ("radixmesh_kv_cache_used_tokens",
             "KV slots held by requests or the radix cache, in tokens.", s.kv_slots_used),
            ("radixmesh_host_kv_cache_capacity_tokens",
             "Tokens the host-memory KV tier can hold (0: no tier).", s.host_kv_slots_total),
            ("radixmesh_host_kv_cache_used_tokens",
             "Tokens kept in the host-memory KV tier.", s.host_kv_slots_used),
            ("radixmesh_host_kv_load_bandwidth_bytes_per_second",
             "Host-to-device reload bandwidth: bytes over the copies' GPU time so far.",
             s.host_kv_load_bandwidth),
            ("radixmesh_host_kv_write_bandwidth_bytes_per_second",
             "Device-to-host copy bandwidth: bytes over the copies' GPU time so far.",
             s.host_kv_write_bandwidth),
        )  # fmt: skip
        counters = (
            ("radixmesh_prefix_cache_queries", "Prompt tokens looked up in the radix cache.",
             s.prompt_tokens),
            ("radixmesh_prefix_cache_hits", "Prompt tokens served from the radix cache.",
             s.cache_hit_tokens),
            ("radixmesh_prefix_cache_host_hits",
             "Prompt tokens served from the radix cache by a reload from host memory "
             "(part of the hits).", s.host_cache_hit_tokens),
            ("radixmesh_host_kv_loaded_bytes", "KV bytes copied from host memory to the device.",
             s.host_kv_bytes_loaded),
            ("radixmesh_host_kv_written_bytes", "KV bytes copied from the device to host memory.",
             s.host_kv_bytes_written),
            ("radixmesh_prompt_tokens", "Prompt tokens admitted.", s.prompt_tokens),
            ("radixmesh_generation_tokens", "Tokens generated.", s.generated_tokens),
            ("radixmesh_num_preemptions", "Requests retracted to free KV memory.",
             s.num_retractions),
            ("radixmesh_constrained_requests", "Requests with a regex/JSON/EBNF/choices rule.",
             s.constrained_requests),
            ("radixmesh_jump_forward_tokens",
             "Output tokens a grammar forced, appended without a decode step.",
             s.jump_forward_tokens),
            ("radixmesh_grammar_compiles",
             "Constraints compiled (not found among the grammars compiled before).",
             s.grammar_compiles),
            ("radixmesh_spec_verify_steps",
             "Request-steps that verified drafted tokens (speculative decoding).",
             s.spec_verify_steps),
            ("radixmesh_spec_draft_tokens", "Tokens drafted for verification.",
             s.spec_drafted_tokens),
            ("radixmesh_spec_accepted_tokens",
             "Drafted tokens the model agreed with (kept without a step of their own).",
             s.spec_accepted_tokens),
        )  # fmt: skip
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=[MODEL_LABEL])
            gauge.add_metric([self.model_name], value)
            yield gauge
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=[MODEL_LABEL])
            counter.add_metric([self.model_name], value)
            yield counter
        if s.spec_accept_lengths:
            yield self._accept_lengths(s.spec_accept_lengths)

    def _accept_lengths(self, counts: tuple[int, ...]) -> Metric:
        """Verify steps by drafts accepted (0 .. k), as a histogram with a bucket each."""
        hist = HistogramMetricFamily(
            "radixmesh_spec_accept_length",
            "Drafted tokens accepted per verify step (speculative decoding).",
            labels=[MODEL_LABEL],
        )
        buckets: list[tuple[str, float]] = []
        total = 0
        for accepted, n in enumerate(counts):
            total += n
            buckets.append((str(float(accepted)), float(total)))
        buckets.append(("+Inf", float(total)))
        value_sum = float(sum(a * n for a, n in enumerate(counts)))
        hist.add_metric([self.model_name], buckets, value_sum)
        return hist


class HeldCounts(Protocol):
    """What the metrics read of the worker's resumable requests (resumable.HeldRequests)."""

    @property
    def waiting(self) -> int: ...

    resumes: int
    expired: int


class _HeldCollector(Collector):
    """Resumable requests (worker/resumable.py), read at scrape time."""

    def __init__(self, held: HeldCounts, model_name: str) -> None:
        self.held = held
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        held = self.held
        gauge = GaugeMetricFamily(
            "radixmesh_resumable_streams_held",
            "Resumable requests whose caller went away, held for a resume (still "
            "generating or finished) until the grace period passes.",
            labels=[MODEL_LABEL],
        )
        gauge.add_metric([self.model_name], held.waiting)
        yield gauge
        for name, doc, value in (
            ("radixmesh_resumable_stream_resumes",
             "Calls that resumed a held request (a client reconnected through a router).",
             held.resumes),
            ("radixmesh_resumable_stream_expiries",
             "Held requests aborted unfinished because nobody resumed them: the grace "
             "period passed, or the bytes bound dropped them first.", held.expired),
        ):  # fmt: skip
            counter = CounterMetricFamily(name, doc, labels=[MODEL_LABEL])
            counter.add_metric([self.model_name], value)
            yield counter


class WorkerMetrics:
    """One registry per worker (tests run several in one process)."""

    def __init__(
        self, read_stats: Callable[[], SchedulerStats | None], model_name: str = ""
    ) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.registry.register(_StatsCollector(read_stats, model_name))

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            h = Histogram(name, doc, [MODEL_LABEL], buckets=buckets, registry=self.registry)
            return h.labels(model_name)  # the child exists (zero) before the first request

        self.ttft = histogram(
            "radixmesh_time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "radixmesh_inter_token_latency_seconds",
            "Time between two generated tokens of one request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "radixmesh_e2e_request_latency_seconds", "Time from arrival to the last token.",
            E2E_BUCKETS,
        )  # fmt: skip
        self.queue_time = histogram(
            "radixmesh_request_queue_time_seconds",
            "Time from arrival to the first admission into the running batch.",
            PHASE_BUCKETS,
        )
        self.prefill_time = histogram(
            "radixmesh_request_prefill_time_seconds",
            "Time from admission to the first generated token.",
            PHASE_BUCKETS,
        )
        self.decode_time = histogram(
            "radixmesh_request_decode_time_seconds",
            "Time from the first generated token to the last.",
            PHASE_BUCKETS,
        )
        self.prompt_len = histogram(
            "radixmesh_request_prompt_tokens", "Prompt length of finished requests, in tokens.",
            LENGTH_BUCKETS,
        )  # fmt: skip
        self.generation_len = histogram(
            "radixmesh_request_generation_tokens",
            "Tokens generated for each finished request.",
            LENGTH_BUCKETS,
        )
        success = Counter(
            "radixmesh_request_success",
            "Finished requests, by finish reason (stop, length, abort).",
            [MODEL_LABEL, "finish_reason"],
            registry=self.registry,
        )
        self.finished = {r: success.labels(model_name, r) for r in FINISH_REASONS}

    def watch_held(self, held: HeldCounts) -> None:
        """Export the resumable requests' gauge and counters (read at scrape time)."""
        self.registry.register(_HeldCollector(held, self.model_name))

    def observe_finished(self, meta: MetaInfo) -> None:
        """A request's final MetaInfo: its phases, lengths and finish reason."""
        for seconds, hist in (
            (meta.queue_time, self.queue_time),
            (meta.prefill_time, self.prefill_time),
            (meta.decode_time, self.decode_time),
        ):
            if seconds is not None:
                hist.observe(seconds)
        self.prompt_len.observe(meta.prompt_tokens)
        self.generation_len.observe(meta.completion_tokens)
        reason = meta.finish.reason if meta.finish is not None else None
        if reason in self.finished:
            self.finished[reason].inc()

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Expose /metrics on host:port (a daemon thread)."""
        start_http_server(port, addr=host, registry=self.registry)
