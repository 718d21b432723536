"""The prefill anatomy's figures from kernels with known times: GEMM and extend-kernel
TFLOP/s, the floor, and a gap whose terms add up to span - floor."""

from __future__ import annotations

import pytest

from bench.anatomy.kernel_trace import Event, Kernel, StepKernels
from bench.anatomy.prefill import StepInfo, distribution, phase_shares, summarize
from radixmesh.worker.model.dummy import preset_arch

ARCH = preset_arch("llama-3-8b")
MS = 1_000_000  # ns


def test_a_prefill_step_against_its_floor() -> None:
    mm = Event("aten::mm", False, 0, 1, corr=7, shapes=((8192, 4096), (4096, 6144)))
    info = StepInfo(kind="prefill", rows=16, tokens=8192, prompt_tokens=8192)
    info.extend_keys = 16 * 512 * 513 // 2
    step = StepKernels(info)
    step.kernels = [
        (Kernel("nvjet_tst_256x128", 0, 2 * MS, 1, mm), "gemm"),  # one op, two kernels
        (Kernel("splitKreduce_kernel", 2 * MS, 3 * MS, 1, mm), "gemm"),
        (Kernel("_extend_kernel", 3 * MS, 4 * MS, 2, None), "attention"),
        (Kernel("_rms_norm_kernel", 5 * MS, 6 * MS, 3, None), "norm"),
    ]
    out = summarize([step], ARCH, 793.0)["prefill"]
    gemm_flop = 2 * 8192 * 6144 * 4096
    (shape,) = out["gemm_shapes"]
    assert (shape["mnk"], shape["calls"]) == ("8192x6144x4096", 1)
    assert shape["tflops"] == pytest.approx(gemm_flop / 3e-3 / 1e12)
    attn_flop = 4 * 128 * 32 * 32 * info.extend_keys
    assert out["attention"]["extend_kernel_tflops"] == pytest.approx(attn_flop / 1e-3 / 1e12)
    assert out["floor_ms"] == pytest.approx((gemm_flop + attn_flop) / 793e12 * 1e3)
    assert (out["span_ms"], out["busy_ms"]) == (6.0, 5.0)
    gap = out["gap_ms"]
    assert gap["idle"] == 1.0 and gap["norm"] == 1.0 and gap["concurrent"] == 0.0
    assert sum(gap.values()) == pytest.approx(out["span_ms"] - out["floor_ms"])


def test_distribution_shows_a_tail() -> None:
    d = distribution([10.0] * 9 + [40.0])  # one slow step in ten
    assert d == {"median": 10.0, "mean": 13.0, "p90": 10.0, "max": 40.0}
    assert distribution([10.0] * 8 + [30.0, 40.0])["p90"] == 30.0
    assert distribution([5.0]) == {"median": 5.0, "mean": 5.0, "p90": 5.0, "max": 5.0}


def test_phase_shares_count_the_wait_apart_from_process_output() -> None:
    host = {"schedule": 1.0, "launch": 3.0, "forward": 2.5, "process_output": 4.0, "wait": 3.0}
    shares = phase_shares(host, 10.0)
    assert shares == pytest.approx(
        {"schedule": 0.1, "launch": 0.3, "process_output": 0.1, "wait": 0.3, "other": 0.2}
    )
    assert phase_shares({}, 0.0)["other"] == 0.0
