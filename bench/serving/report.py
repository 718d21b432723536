"""Summaries of a run (SGLang `bench_serving`'s metrics), the table, and the plots.

Definitions: request throughput = completed requests / duration; output throughput =
output tokens / duration; TPOT = (E2E - TTFT) / (output tokens - 1) per request; ITL =
every gap between token-carrying chunks; concurrency = summed E2E / duration; goodput =
completed requests meeting the SLO (TTFT <= `slo_ttft` and TPOT <= `slo_tpot`) per second;
goodput_ttft = those meeting the TTFT bound alone (the router simulator's goodput).
Hit rate = cached prompt tokens / prompt tokens; the ideal is what a cache that kept every
shared prefix and history would have hit (the workload's `ideal_cached`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.serving.clients import RequestResult

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    ttft: float = 1.0  # seconds
    tpot: float = 0.05  # seconds per output token after the first


def _stats(values: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """Mean and percentiles, in milliseconds by default."""
    if not values:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PERCENTILES}}
    arr = np.asarray(values, dtype=np.float64) * scale
    out = {"mean": float(arr.mean())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(arr, p))
    return out


def _tpot(r: RequestResult) -> float | None:
    return (r.e2e - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else None


def _hit(rs: Sequence[RequestResult]) -> dict[str, float]:
    prompt = sum(r.prompt_tokens for r in rs)
    cached = sum(r.cached_tokens for r in rs)
    ideal = sum(min(r.ideal_cached, r.prompt_tokens) for r in rs)
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "ideal_hit_rate": ideal / prompt if prompt else 0.0,
        "of_ideal": cached / ideal if ideal else float("nan"),
    }


def summarize(results: Sequence[RequestResult], duration: float, slo: Slo) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tpots = [t for r in ok if (t := _tpot(r)) is not None]
    good = [r for r in ok if r.ttft <= slo.ttft and (_tpot(r) or 0.0) <= slo.tpot]
    out_tokens = sum(r.output_tokens for r in ok)
    per_worker: dict[str, list[RequestResult]] = defaultdict(list)
    for r in ok:
        per_worker[r.worker or "?"].append(r)
    return {
        "requests": len(results),
        "completed": len(ok),
        "failures": dict(Counter(r.error for r in results if not r.ok)),
        "first_failure": next((f"{r.error}: {r.detail}" for r in results if not r.ok), ""),
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "input_throughput": sum(r.prompt_tokens for r in ok) / duration if duration else 0.0,
        "output_throughput": out_tokens / duration if duration else 0.0,
        "output_tokens": out_tokens,
        "concurrency": sum(r.e2e for r in ok) / duration if duration else 0.0,
        "goodput": len(good) / duration if duration else 0.0,
        "goodput_ttft": sum(r.ttft <= slo.ttft for r in ok) / duration if duration else 0.0,
        "slo": {"ttft_s": slo.ttft, "tpot_s": slo.tpot},
        "ttft_ms": _stats([r.ttft for r in ok]),
        "itl_ms": _stats([g for r in ok for g in r.itl]),
        "tpot_ms": _stats(tpots),
        "e2e_ms": _stats([r.e2e for r in ok]),
        "cache": _hit(ok),
        "per_worker": {
            w: {"requests": len(rs), **_hit(rs)} for w, rs in sorted(per_worker.items())
        },
    }


def hit_rate_timeline(
    results: Sequence[RequestResult], duration: float, bins: int = 20
) -> dict[str, list[float | None]]:
    """Per worker, the hit rate of the requests sent in each of `bins` equal slices of
    the run's `duration` (None where a worker got none); "t" holds the slices' midpoints
    in seconds."""
    ok = [r for r in results if r.ok]
    if not ok or duration <= 0:
        return {"t": []}
    width = duration / bins
    prompt: dict[str, list[int]] = defaultdict(lambda: [0] * bins)
    cached: dict[str, list[int]] = defaultdict(lambda: [0] * bins)
    for r in ok:
        b = min(int(r.start / width), bins - 1)
        prompt[r.worker or "?"][b] += r.prompt_tokens
        cached[r.worker or "?"][b] += r.cached_tokens
    out: dict[str, list[float | None]] = {"t": [(i + 0.5) * width for i in range(bins)]}
    for w in sorted(prompt):
        out[w] = [c / p if p else None for c, p in zip(cached[w], prompt[w], strict=True)]
    return out


ROW = "{:<14} {:<12} {:<9} {:>14} {:>7} {:>7} {:>9} {:>8} {:>8} {:>7} {:>7} {:>7} {:>5} {:>5} {:>7}"
VIA = {
    "openai-completions": "http",
    "openai-chat": "chat",
    "grpc": "grpc",
    "grpc-unary": "unary",
    "grpc-direct": "direct",
    "grpc-unary-direct": "unary-dir",
}


def table(runs: Sequence[dict[str, Any]]) -> str:
    """One line per run: throughput, latency percentiles (ms), hit rate against the ideal."""
    lines = [
        ROW.format(
            "workload", "policy", "via", "load", "done", "req/s", "out tok/s", "TTFT p50",
            "TTFT p99", "ITL p50", "ITL p99", "goodput", "hit", "/ideal", "cpu/1k",
        ),
    ]  # fmt: skip
    for run in runs:
        s = run["summary"]
        lines.append(
            ROW.format(
                run["workload"][:14],
                run["policy"][:12],
                VIA.get(run.get("backend", ""), "?"),
                run["load"][:14],
                f"{s['completed']}/{s['requests']}",
                f"{s['request_throughput']:.2f}",
                f"{s['output_throughput']:.0f}",
                f"{s['ttft_ms']['p50']:.0f}",
                f"{s['ttft_ms']['p99']:.0f}",
                f"{s['itl_ms']['p50']:.1f}",
                f"{s['itl_ms']['p99']:.1f}",
                f"{s['goodput']:.2f}",
                f"{s['cache']['hit_rate']:.0%}",
                _pct(s["cache"]["of_ideal"]),
                _cpu(s),
            )
        )
    return "\n".join(lines)


def _cpu(s: dict[str, Any]) -> str:
    """The router tier's CPU seconds per 1,000 output tokens ('-' where not measured)."""
    v = s.get("router_cpu_s_per_1k_tokens")
    return "-" if v is None else f"{v:.3f}"


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:.0%}"  # NaN: no ideal hits in the trace


def plot_latency(runs: Sequence[dict[str, Any]], path: Path) -> None:
    """TTFT and ITL percentiles against the offered request rate, one line per policy and
    percentile, one panel per workload and metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r["workload"] for r in runs})
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.6 * len(workloads)), squeeze=False)
    for row, wl in enumerate(workloads):
        mine = [r for r in runs if r["workload"] == wl]
        for col, metric in enumerate(("ttft_ms", "itl_ms")):
            ax = axes[row][col]
            for policy in sorted({r["policy"] for r in mine}):
                pts = sorted(
                    (r["rate_achieved"], r["summary"][metric])
                    for r in mine
                    if r["policy"] == policy
                )
                for p, style in (("p50", "-o"), ("p99", "--^")):
                    ax.plot(
                        [x for x, _ in pts], [s[p] for _, s in pts], style, label=f"{policy} {p}"
                    )
            ax.set_xlabel("request throughput (req/s)")
            ax.set_ylabel(metric.replace("_ms", " (ms)").upper())
            ax.set_yscale("log")
            ax.set_title(wl)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_hit_timeline(runs: Sequence[dict[str, Any]], path: Path) -> None:
    """Per-worker cache hit rate over each run's time, one panel per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        tl = run["hit_timeline"]
        for worker, rates in tl.items():
            if worker == "t":
                continue
            pts = [(t, h) for t, h in zip(tl["t"], rates, strict=True) if h is not None]
            ax.plot([t for t, _ in pts], [h for _, h in pts], "-o", ms=3, label=worker)
        ideal = run["summary"]["cache"]["ideal_hit_rate"]
        ax.axhline(ideal, color="gray", ls=":", label="ideal (whole run)")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("hit rate")
        ax.set_title(f"{run['workload']} / {run['policy']} / {run['load']}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[-1][0].set_xlabel("seconds since the run began")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
