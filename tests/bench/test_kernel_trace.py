"""A GPU-shaped trace (kernels linked to runtime calls and CPU ops) as kernels per step:
the attribution the H200 run relies on, checked on events built here."""

from __future__ import annotations

from types import SimpleNamespace

from bench.anatomy.kernel_trace import (
    Event,
    assign,
    category,
    gemm_mnk,
    kernels,
    step_figures,
    windows,
)

US = 1000  # ns


def cpu(name: str, start: int, end: int, corr: int = 0, linked: int = 0, **kw: object) -> Event:
    return Event(name, False, start * US, end * US, corr, linked, **kw)  # type: ignore[arg-type]


def gpu(name: str, start: int, end: int, corr: int, linked: int = 0) -> Event:
    return Event(name, True, start * US, end * US, corr, linked)


def trace() -> list[Event]:
    return [
        cpu("anatomy::step", 0, 100),
        cpu("anatomy::step", 100, 200),
        cpu("anatomy::sampling", 150, 160),
        cpu("aten::mm", 10, 20, corr=5, shapes=((8, 64), (64, 128))),
        cpu("cudaLaunchKernel", 12, 14, corr=900, linked=5),
        cpu("cuLaunchKernelEx", 110, 111, corr=901),
        cpu("cudaLaunchKernel", 155, 156, corr=902),
        gpu("anatomy::step", 30, 60, corr=0),  # the range's GPU mirror: not a kernel
        gpu("nvjet_tst_128x256_64x4", 30, 50, corr=900, linked=5),
        gpu("_extend_kernel", 120, 140, corr=901),
        gpu("_rms_norm_kernel", 135, 138, corr=903),  # no runtime call: its GPU start
        gpu("reduce_kernel", 170, 175, corr=902),
        gpu("Memcpy DtoH (Device -> Pinned)", 300, 301, corr=904),  # after every step
    ]


def test_kernels_find_their_launch_op_step_and_category() -> None:
    events = trace()
    ks = kernels(events)
    assert [k.name for k in ks] == [
        "nvjet_tst_128x256_64x4",
        "_extend_kernel",
        "_rms_norm_kernel",
        "reduce_kernel",
        "Memcpy DtoH (Device -> Pinned)",
    ]
    gemm = ks[0]
    assert gemm.launch == 12 * US and gemm.op is not None and gemm_mnk(gemm.op) == (8, 128, 64)
    steps, lost = assign(
        [SimpleNamespace(kind="prefill"), SimpleNamespace(kind="decode")], ks, windows(events)
    )
    assert lost == 0
    assert [(k.name, c) for k, c in steps[0].kernels] == [("nvjet_tst_128x256_64x4", "gemm")]
    assert [c for _, c in steps[1].kernels] == ["attention", "norm", "sampling", "copy"]
    figs = step_figures(steps)
    assert figs[0]["span_ms"] == (120 - 30) / 1000  # to the next step's first kernel
    assert figs[0]["busy_ms"] == 20 / 1000
    # 120..140 and 135..138 overlap; then 170..175 and 300..301
    assert figs[1]["busy_ms"] == (20 + 5 + 1) / 1000
    assert figs[1]["span_ms"] == (301 - 120) / 1000


def test_gemm_shapes_from_each_op_form() -> None:
    def op(name: str, *shapes: tuple[int, ...]) -> Event:
        return cpu(name, 0, 1, shapes=shapes)

    assert gemm_mnk(op("aten::addmm", (128,), (8, 64), (64, 128), (), ())) == (8, 128, 64)
    assert gemm_mnk(op("aten::bmm", (4, 8, 64), (4, 64, 16))) == (32, 16, 64)
    assert gemm_mnk(op("mkldnn::_linear_pointwise", (8, 64), (128, 64), ())) == (8, 128, 64)
    assert gemm_mnk(op("aten::mm", (8, 64))) is None
    assert gemm_mnk(op("aten::add", (8, 64), (8, 64))) is None


def test_cpu_trace_counts_the_innermost_gemm_and_leaves_outside_it() -> None:
    events = [
        cpu("anatomy::step", 0, 100),
        cpu("aten::linear", 1, 50, corr=1, shapes=((8, 64), (128, 64))),
        cpu("aten::matmul", 2, 49, corr=2),
        cpu("aten::mm", 3, 48, corr=3, shapes=((8, 64), (64, 128))),
        cpu("aten::resolve_conj", 4, 5, corr=4),
        cpu("aten::silu", 60, 70, corr=5),
    ]
    ks = kernels(events)
    assert [k.name for k in ks] == ["aten::mm", "aten::silu"]
    assert category(ks[0], None) == "gemm" and category(ks[1], "activation") == "activation"
    assert category(ks[0], "attention") == "attention"  # the torch backend's matmuls
