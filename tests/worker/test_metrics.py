"""The worker's collector on given stats: speculative decoding's counters and its accept
length histogram (one bucket per accepted count), valid exposition text (promtool)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.worker.metrics import WorkerMetrics
from radixmesh.worker.stats import SchedulerStats

ROOT = Path(__file__).resolve().parents[2]


def _stats(**spec: object) -> SchedulerStats:
    return SchedulerStats(1, 0, 10, 100, 5, 0, 0, 0, 0, 3, **spec)  # type: ignore[arg-type]


def _samples(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in s.labels.items() if k != "model_name")
            out[s.name, labels] = s.value
    return out


def test_speculative_counters_and_accept_length_histogram() -> None:
    stats = _stats(
        spec_verify_steps=10,
        spec_drafted_tokens=40,
        spec_accepted_tokens=17,
        spec_accept_lengths=(3, 2, 1, 0, 4),
    )
    text = generate_latest(WorkerMetrics(lambda: stats, "m").registry).decode()
    s = _samples(text)
    assert s["radixmesh_spec_verify_steps_total", ""] == 10
    assert s["radixmesh_spec_draft_tokens_total", ""] == 40
    assert s["radixmesh_spec_accepted_tokens_total", ""] == 17
    buckets = [
        s["radixmesh_spec_accept_length_bucket", f"le={le}"]
        for le in ("0.0", "1.0", "2.0", "3.0", "4.0", "+Inf")
    ]
    assert buckets == [3, 5, 6, 6, 10, 10]
    assert s["radixmesh_spec_accept_length_count", ""] == 10
    assert s["radixmesh_spec_accept_length_sum", ""] == 2 + 2 + 16
    local = ROOT / ".tools" / "bin" / "promtool"
    promtool = str(local) if local.exists() else shutil.which("promtool")
    assert promtool is not None, "promtool not found (`make tools` installs it)"
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr


def test_no_histogram_without_speculation() -> None:
    text = generate_latest(WorkerMetrics(_stats, "m").registry).decode()
    assert "radixmesh_spec_accept_length" not in text
    assert _samples(text)["radixmesh_spec_verify_steps_total", ""] == 0
