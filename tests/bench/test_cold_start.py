"""bench.cold_start without a GPU: a smoke run, each configuration in its own process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

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
        # The compile log: every phase summed; on a CPU nothing compiles (no Triton kernel
        # runs there, and the interpreter compiles none)
        assert list(r["compiles"]) == list(cold_start.PHASES)
        if not torch.cuda.is_available():
            assert r["compile_log"] == []
            assert all(s == {"compiles": 0, "seconds": 0.0} for s in r["compiles"].values())


def test_the_first_batchs_compiles_are_listed_longest_first_with_their_step() -> None:
    def compile_(phase: str, seconds: float, step: int | None, batch: str | None) -> dict:
        return {
            "kernel": "m._k",
            "signature": "n:i32/16, B=64, warps=4, stages=2",
            "seconds": seconds,
            "phase": phase,
            "step": step,
            "batch": batch,
        }

    run = {
        "compiles": {
            "start": {"compiles": 1, "seconds": 0.5},
            "warmup": {"compiles": 0, "seconds": 0.0},
            "first": {"compiles": 2, "seconds": 0.75},
            "warm": {"compiles": 0, "seconds": 0.0},
        },
        "compile_log": [
            compile_("start", 0.5, None, None),
            compile_("first", 0.25, 3, "1024 decode rows"),
            compile_("first", 0.5, 1, "mixed: 600 decode rows + 1 chunk, 128 tokens"),
        ],
    }
    assert cold_start.compiles_report(run, detail=True).splitlines() == [
        "  Triton compiles: start 1 (0.5 s), warmup 0 (0.0 s), first 2 (0.8 s), warm 0 (0.0 s)",
        "     0.50 s m._k (step 1: mixed: 600 decode rows + 1 chunk, 128 tokens) "
        "[n:i32/16, B=64, warps=4, stages=2]",
        "     0.25 s m._k (step 3: 1024 decode rows) [n:i32/16, B=64, warps=4, stages=2]",
    ]
    assert len(cold_start.compiles_report(run, detail=False).splitlines()) == 1
    assert cold_start.compiles_report(run, detail=True, limit=1).endswith("1 more in compile_log")


def test_an_unknown_warmup_setting_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--warmup: 'maybe'"):
        cold_start.main(["--smoke", "--warmup", "maybe"])


def test_module_loading_runs_each_configuration_lazily_and_eagerly(tmp_path: Path) -> None:
    out = tmp_path / "cold.json"
    argv = ["--smoke", "--configs", "bf16", "--warmup", "on", "--module-loading", "lazy,eager"]
    cold_start.main([*argv, "--out", str(out)])
    runs = json.loads(out.read_text())["runs"]
    assert sorted(runs) == ["bf16/warmup-on", "bf16/warmup-on/lazy-modules"]
    assert runs["bf16/warmup-on"]["cuda_module_loading"] == "EAGER"
    assert runs["bf16/warmup-on/lazy-modules"]["cuda_module_loading"] == "LAZY"
    for r in runs.values():
        assert r["first"]["output_tokens"] == r["warm"]["output_tokens"] == 4 * 4


def test_module_loading_refuses_other_values() -> None:
    with pytest.raises(ValueError, match="--module-loading"):
        cold_start.main(["--smoke", "--module-loading", "eagerly"])


def test_host_parts_set_each_batchs_host_time_and_counters_beside_the_others(
    tmp_path: Path,
) -> None:
    """Per batch: the scheduler's three parts and their steps (the same batch twice, run
    synchronously: the same steps), the garbage collector's collections; with
    --host-profile, the functions ranked by the first batch's extra time."""
    out = tmp_path / "cold.json"
    argv = ["--smoke", "--configs", "bf16", "--warmup", "on", "--overlap", "off"]
    cold_start.main([*argv, "--host-profile", "3", "--out", str(out)])
    r = json.loads(out.read_text())["runs"]["bf16/warmup-on/overlap-off"]
    first, warm = r["host_parts"]["first"], r["host_parts"]["warm"]
    assert first["steps"] == warm["steps"] > 0
    for part in cold_start.HostParts.PARTS:
        assert first[part] > 0 and warm[part] > 0
    assert {"gc_gen0", "gc_gen1", "gc_gen2"} <= set(first)
    gap = r["host_profile_gap"]
    assert sorted(gap) == ["by_cumulative", "by_own"]
    for rows in gap.values():
        assert len(rows) == 3
        assert all(isinstance(fn, str) and a >= 0 and b >= 0 for fn, a, b in rows)
    lines = cold_start.host_parts_report(r).splitlines()
    assert lines[0] == "  host parts and counters (first / warm):"
    assert lines[1].split()[0] == "schedule" and lines[1].endswith(" ms")
