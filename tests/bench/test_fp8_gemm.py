"""bench.fp8_gemm's sweep (bench/fp8_sweep.py) without a GPU: its candidate configs, and
that its "best" lines paste into the kernel's tables as they are."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench import fp8_sweep
from radixmesh.worker.layers.kernels.fp8_small_m import (
    CONFIGS,
    MEASURED,
    LaunchConfig,
    split_k_guess,
)


@pytest.mark.parametrize("name", sorted(fp8_sweep.SHAPES))
def test_candidates_fit_and_include_the_measured_configs_and_the_guess(name: str) -> None:
    n, k = fp8_sweep.SHAPES[name]
    configs = fp8_sweep.candidates(n, k)
    assert len(set(configs)) == len(configs)
    assert split_k_guess(n, k, sms=fp8_sweep.SMS) in configs
    assert MEASURED in configs
    assert CONFIGS[(n, k)] in configs  # the last sweep's best is timed again
    assert {c.variant for c in configs} == {"dot", "gemv"}
    for cfg in configs:
        assert cfg.shared_bytes() <= fp8_sweep.SHARED_LIMIT, cfg
        assert k // cfg.split_k >= 2 * cfg.block_k, cfg
        if cfg.split_k > 1:
            assert math.ceil(n / cfg.block_n) * cfg.split_k <= 8 * fp8_sweep.SMS, cfg


def test_gemv_tiles_are_timed_only_at_rows_their_registers_hold() -> None:
    wide = LaunchConfig(block_n=64, block_k=512, num_warps=8, variant="gemv")
    assert fp8_sweep.fits(wide, 1) and not fp8_sweep.fits(wide, 4)
    narrow = LaunchConfig(block_n=16, block_k=128, variant="gemv")  # 16 x 16 x 128 / 128
    assert fp8_sweep.fits(narrow, 16)
    assert fp8_sweep.fits(LaunchConfig(block_n=64, block_k=512), 16)  # dot: always


def test_persistent_grids_only_where_tiles_outnumber_programs() -> None:
    cfg = LaunchConfig(block_n=32, block_k=256, split_k=2)
    # 4096 columns: 128 blocks x 2 slices = 256 tiles; 132 programs (1 per SM) only.
    assert [c.programs_per_sm for c in fp8_sweep.persistent([cfg], 4096)] == [1]
    assert [c.programs_per_sm for c in fp8_sweep.persistent([cfg], 28672)] == [1, 2, 4]


def test_compile_keys_one_per_kernel() -> None:
    a = LaunchConfig(block_n=32, block_k=256, split_k=2)
    b = LaunchConfig(block_n=32, block_k=256, split_k=8)  # the same GEMM kernel as a
    c = LaunchConfig(block_n=32, block_k=256, split_k=1)
    d = LaunchConfig(block_n=32, block_k=256, split_k=1, variant="gemv")
    e = LaunchConfig(block_n=32, block_k=256, split_k=1, programs_per_sm=2)
    f = LaunchConfig(block_n=32, block_k=256, split_k=1, programs_per_sm=4)  # as e
    assert fp8_sweep.compile_keys([a, b, c, d, e, f]) == [a, c, d, e]


def _row(cfg: LaunchConfig, us: dict[int, float]) -> dict[str, Any]:
    return {"config": cfg.entry(), "us": us, "ok": True, "total_us": sum(us.values())}


def _result(name: str, n: int, k: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    best = fp8_sweep.best_of(rows)
    return {
        "shape": name,
        "n": n,
        "k": k,
        "copies": 2,
        "bf16_us": {1: 20.0, 4: 20.0, 16: 21.0},
        "configs": rows,
        "best": best,
        "best_by_rows": fp8_sweep.best_by_rows(rows, best),
    }


def test_best_lines_paste_into_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    fast = LaunchConfig(block_n=64, block_k=512, split_k=2, num_warps=8, num_stages=3)
    slow = LaunchConfig(block_n=32, block_k=256)
    gemv = LaunchConfig(block_n=16, block_k=512, split_k=8, variant="gemv", programs_per_sm=2)
    rows: list[dict[str, Any]] = [
        _row(fast, {1: 9.0, 4: 9.5, 16: 10.0}),
        _row(slow, {1: 14.0, 4: 14.5, 16: 15.0}),
        {"config": gemv.entry(), "us": {1: 7.0}, "ok": True, "total_us": None},  # 1 row only
        {
            "config": "LaunchConfig(block_n=16)",
            "error": "OutOfResources()",
            "ok": False,
            "total_us": None,
        },
    ]
    failed = _result("down", 4096, 14336, rows[3:])
    fp8_sweep.print_sweep([_result("o", 4096, 4096, rows), failed])
    printed = capsys.readouterr().out
    tables = printed.split("for CONFIGS in fp8_small_m.py:\n", 1)[1]
    configs, by_rows = tables.split("for ROW_CONFIGS:\n")
    lines = [line for line in configs.splitlines() if line.strip()]
    assert lines[0].strip() == "# o: 9.0/9.5/10.0 us, 1.86/1.77/1.68 TB/s, 0.45/0.47/0.48x bf16"
    assert lines[2].strip() == "# down: no candidate passed the error check"
    source = "{\n" + "\n".join(lines[:2]) + "\n}"  # the lines as pasted between the braces
    assert eval(source, {"LaunchConfig": LaunchConfig}) == {(4096, 4096): fast}
    source = "{\n" + by_rows + "\n}"
    assert eval(source, {"LaunchConfig": LaunchConfig}) == {(4096, 4096, 1): gemv}
    assert "OutOfResources" in printed
    assert "1.68/1.68/1.60 TB/s" in printed  # bf16: 2 bytes a weight at 20/20/21 us
