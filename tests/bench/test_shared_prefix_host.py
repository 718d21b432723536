"""bench.shared_prefix_host on a small shared-prefix workload: both runners give every
request its tokens, each prefix is computed once, and the table is recorded."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import shared_prefix_host


def _args(**over: object) -> argparse.Namespace:
    args = dict(
        groups=2,
        per_group=6,
        prefix_tokens=40,
        own=5,
        new_tokens=3,
        max_running=4,
        token_budget=64,
        overlap=True,
        runners="inputs,scheduler",
        repeats=2,
        profile=None,
    )
    args.update(over)
    return argparse.Namespace(**args)


def test_both_runners_run_the_workload() -> None:
    result = shared_prefix_host.run(_args())
    assert sorted(result) == ["inputs", "scheduler"]
    for r in result.values():
        for series in shared_prefix_host.SERIES:
            assert len(r[series]) == 2
        # 3 calls (the warm-up and two timed), 12 prompts of 45 tokens each; one_call
        # asserted each call's outputs, cache hits and slots.
        assert r["prompt_tokens"] == 3 * 12 * 45


def test_synchronous_scheduler_too() -> None:
    result = shared_prefix_host.run(_args(overlap=False, runners="inputs", repeats=1))
    assert list(result) == ["inputs"]


def test_main_writes_the_record(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    shared_prefix_host.main(
        [
            *("--groups", "2", "--per-group", "4", "--prefix-tokens", "40", "--own", "4"),
            *("--new-tokens", "2", "--max-running", "4", "--token-budget", "256"),
            *("--repeats", "1", "--runners", "scheduler", "--out", str(out)),
        ]
    )
    record = json.loads(out.read_text())
    assert record["benchmark"] == "shared_prefix_host"
    assert record["workload"]["requests"] == 8
    this = record["results"]["this"]["scheduler"]
    assert len(this["runs_s"]) == 1
    assert this["req_per_s_best"] == 8 / this["best_s"]
