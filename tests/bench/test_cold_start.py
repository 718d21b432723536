"""bench.cold_start without a GPU: a smoke run, each configuration in its own process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import cold_start


def test_smoke_run_records_first_and_warm_batches_with_and_without_warmup(tmp_path: Path) -> None:
    out = tmp_path / "cold.json"
    cold_start.main(["--smoke", "--configs", "bf16", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["benchmark"] == "cold_start" and record["model"] == "dummy:tiny"
    runs = record["runs"]
    assert sorted(runs) == ["bf16/warmup-off", "bf16/warmup-on"]
    assert runs["bf16/warmup-on"]["warmup_steps"] > 0
    assert runs["bf16/warmup-off"]["warmup_steps"] == 0
    for r in runs.values():
        assert r["first"]["output_tokens"] == r["warm"]["output_tokens"] == 4 * 4
        assert r["first_vs_warm"] > 0
        assert r["max_running_requests"] == 64  # CPU's default, whatever the pool


def test_an_unknown_warmup_setting_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--warmup: 'maybe'"):
        cold_start.main(["--smoke", "--warmup", "maybe"])
