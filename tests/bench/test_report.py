"""The serving benchmark's metrics on hand-made request results (exact values)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.serving.clients import RequestResult
from bench.serving.report import Slo, hit_rate_timeline, plot_hit_timeline, plot_latency, summarize


def _r(start: float, ttft: float, e2e: float, out: int, **kw: Any) -> RequestResult:
    gaps = [(e2e - ttft) / (out - 1)] * (out - 1) if out > 1 else []
    return RequestResult(start=start, ttft=ttft, e2e=e2e, itl=gaps, output_tokens=out, **kw)


RESULTS = [
    _r(0.0, 0.1, 1.1, 11, prompt_tokens=100, cached_tokens=0, ideal_cached=0, worker="w0"),
    _r(0.5, 0.2, 2.2, 21, prompt_tokens=100, cached_tokens=80, ideal_cached=80, worker="w1"),
    _r(1.0, 2.0, 3.0, 11, prompt_tokens=100, cached_tokens=40, ideal_cached=80, worker="w0"),
    RequestResult(start=1.5, error="http_429", detail="busy"),
]


def test_summary_figures() -> None:
    s = summarize(RESULTS, duration=4.0, slo=Slo(ttft=1.0, tpot=0.15))
    assert (s["requests"], s["completed"], s["failures"]) == (4, 3, {"http_429": 1})
    assert s["first_failure"] == "http_429: busy"
    assert s["request_throughput"] == 0.75
    assert s["output_tokens"] == 43
    assert s["output_throughput"] == 43 / 4
    assert s["input_throughput"] == 300 / 4
    assert s["concurrency"] == pytest.approx((1.1 + 2.2 + 3.0) / 4)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["tpot_ms"]["mean"] == pytest.approx(100.0)  # every request: 0.1 s per token
    # The third request misses the TTFT bound: two meet the SLO.
    assert s["goodput"] == s["goodput_ttft"] == 0.5
    # Under a TPOT bound every request misses, the TTFT bound alone still passes two.
    tight = summarize(RESULTS, duration=4.0, slo=Slo(ttft=1.0, tpot=0.05))
    assert (tight["goodput"], tight["goodput_ttft"]) == (0.0, 0.5)
    assert s["cache"] == {
        "prompt_tokens": 300,
        "cached_tokens": 120,
        "hit_rate": 0.4,
        "ideal_hit_rate": 160 / 300,
        "of_ideal": 0.75,
    }
    assert s["per_worker"]["w0"]["requests"] == 2
    assert s["per_worker"]["w0"]["hit_rate"] == 0.2
    assert s["per_worker"]["w1"]["hit_rate"] == 0.8


def test_hit_timeline_bins_by_send_time() -> None:
    tl = hit_rate_timeline(RESULTS, duration=2.0, bins=2)
    assert tl["t"] == [0.5, 1.5]
    assert tl["w0"] == [0.0, 0.4]
    assert tl["w1"] == [0.8, None]


def test_plots_are_written(tmp_path: Path) -> None:
    summary = summarize(RESULTS, duration=4.0, slo=Slo())
    runs = [
        {
            "workload": "random",
            "policy": p,
            "load": "rate 1/s",
            "rate_achieved": r,
            "summary": summary,
            "hit_timeline": hit_rate_timeline(RESULTS, 4.0),
        }
        for p, r in (("a", 0.5), ("a", 0.75), ("b", 0.6))
    ]
    plot_latency(runs, tmp_path / "lat.png")
    plot_hit_timeline(runs, tmp_path / "hits.png")
    for name in ("lat.png", "hits.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
