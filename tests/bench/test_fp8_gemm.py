"""bench.fp8_gemm's sweep without a GPU: its candidate configs, and that its "best" lines
paste into the kernel's table as they are."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench import fp8_gemm
from radixmesh.worker.layers.kernels.fp8_small_m import MEASURED, LaunchConfig, split_k_guess


@pytest.mark.parametrize("name", sorted(fp8_gemm.SHAPES))
def test_candidates_fit_and_include_the_measured_config_and_the_guess(name: str) -> None:
    n, k = fp8_gemm.SHAPES[name]
    configs = fp8_gemm.candidates(n, k)
    assert len(set(configs)) == len(configs)
    assert split_k_guess(n, k, sms=fp8_gemm.SMS) in configs
    assert MEASURED in configs
    for cfg in configs:
        assert cfg.shared_bytes() <= fp8_gemm.SHARED_LIMIT, cfg
        assert k // cfg.split_k >= 2 * cfg.block_k, cfg
        if cfg.split_k > 1:
            assert math.ceil(n / cfg.block_n) * cfg.split_k <= 8 * fp8_gemm.SMS, cfg


def test_compile_keys_one_per_kernel() -> None:
    a = LaunchConfig(block_n=32, block_k=256, split_k=2)
    b = LaunchConfig(block_n=32, block_k=256, split_k=8)  # the same GEMM kernel as a
    c = LaunchConfig(block_n=32, block_k=256, split_k=1)
    assert fp8_gemm.compile_keys([a, b, c]) == [a, c]


def _result(name: str, n: int, k: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    best = fp8_gemm.best_of(rows)
    bf16 = {1: 20.0, 4: 20.0, 16: 21.0}
    return {
        "shape": name,
        "n": n,
        "k": k,
        "copies": 2,
        "bf16_us": bf16,
        "configs": rows,
        "best": best,
    }


def test_best_lines_paste_into_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    fast = LaunchConfig(block_n=64, block_k=512, split_k=2, num_warps=8, num_stages=3)
    slow = LaunchConfig(block_n=32, block_k=256)
    us = {1: 9.0, 4: 9.5, 16: 10.0}
    rows: list[dict[str, Any]] = [
        {"config": slow.entry(), "us": {m: v + 5 for m, v in us.items()}, "ok": True},
        {"config": fast.entry(), "us": us, "ok": True},
        {"config": "LaunchConfig(block_n=16)", "error": "OutOfResources()", "ok": False},
    ]
    for r in rows:
        r["total_us"] = sum(r["us"].values()) if "us" in r else None
    fp8_gemm.print_sweep([_result("o", 4096, 4096, rows), _result("down", 4096, 14336, rows[2:])])
    printed = capsys.readouterr().out
    best = printed.split("for CONFIGS in fp8_small_m.py:\n", 1)[1]
    lines = [line for line in best.splitlines() if line.strip()]
    assert lines[1].strip() == "# down: no candidate passed the error check"
    source = "{\n" + lines[0] + "\n}"  # the line as pasted between the braces
    assert eval(source, {"LaunchConfig": LaunchConfig}) == {(4096, 4096): fast}
    assert "OutOfResources" in printed
