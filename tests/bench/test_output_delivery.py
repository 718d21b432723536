"""bench.output_delivery on a few requests: both deliveries run and give every token."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import output_delivery


def test_both_deliveries_run_and_are_recorded(tmp_path: Path) -> None:
    args = argparse.Namespace(
        requests=12, prompt=8, new_tokens=5, running=8, repeats=1, out=str(tmp_path / "r.json")
    )
    result = output_delivery.run(args)
    assert sorted(result["deliveries"]) == ["steps", "whole"]
    assert all(len(f["runs_s"]) == 1 for f in result["deliveries"].values())
    assert result["workload"]["requests"] == 12
