"""bench.fp8_decode_launch: the CUDA launch with the least geometric mean time over the
sweep's batch >= 64 shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.fp8_decode_launch import best_launch, main


def _row(batch: int, warps: int, stages: int, ms: float, cuda: bool = True) -> dict:
    return {
        "batch": batch, "cuda": cuda, "num_warps": warps, "block_n": 16,
        "num_stages": stages, "min_blocks": 0, "ms": ms,
    }  # fmt: skip


def test_least_geometric_mean_over_the_large_batches() -> None:
    rows = [
        # (4, 3): 0.2 and 0.9 -> geomean 0.42; (2, 4): 0.3 and 0.5 -> 0.39, the least.
        _row(256, 4, 3, 0.2), _row(256, 4, 3, 0.9),
        _row(256, 2, 4, 0.3), _row(256, 2, 4, 0.5),
        _row(1, 4, 3, 0.001), _row(1, 2, 4, 0.9),  # batch 1: not counted
        _row(256, 8, 3, 0.01, cuda=False), _row(256, 8, 3, 0.01, cuda=False),  # Triton
    ]  # fmt: skip
    assert best_launch(rows) == (2, 16, 4, 0)


def test_a_launch_missing_a_shape_is_not_chosen() -> None:
    rows = [_row(256, 4, 3, 0.5), _row(64, 4, 3, 0.5), _row(256, 2, 4, 0.1)]
    assert best_launch(rows) == (4, 16, 3, 0)


def test_prints_the_switch_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"decode_sweep": [_row(256, 4, 4, 0.3)]}))
    main([str(path)])
    assert capsys.readouterr().out == "cuda:4,16,4,0\n"


def test_only_the_backends_split_count_is_compared() -> None:
    # The quick sweep times each launch at other split counts too; a launch is chosen by
    # its time at the engine's count, not by a faster time at another.
    rows = [
        {**_row(256, 4, 3, 0.5), "splits": 2, "backend_splits": 2},
        {**_row(256, 4, 3, 0.05), "splits": 1, "backend_splits": 2},
        {**_row(256, 2, 4, 0.3), "splits": 2, "backend_splits": 2},
    ]
    assert best_launch(rows) == (2, 16, 4, 0)
