"""The FP8 GEMM kernel table (layers/quantization/fp8_gemm_choice.py): row buckets, the
margin rule, the cache and shipped files, the switches and deterministic mode, on CPU with
injected timings; on CUDA a table measured for real, whose every choice gives the
reference result, and `fp8_linear` taking the kernel the table names."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from radixmesh.worker.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from radixmesh.worker.layers.quantization import fp8_gemm_choice as fgc
from radixmesh.worker.layers.quantization import fp8_gemm_table as fgt
from radixmesh.worker.layers.quantization.fp8 import (
    Fp8LinearMethod,
    fp8_linear,
    fp8_linear_ref,
    fp8_linear_scaled_mm,
    fp8_linear_tensorwise,
    quantize_rows,
)
from radixmesh.worker.layers.quantization.fp8_activation import Fp8Activation
from radixmesh.worker.layers.quantization.fp8_gemm_choice import (
    Operand,
    prepare,
    read_table,
    write_table,
)
from radixmesh.worker.layers.quantization.fp8_gemm_table import (
    BUCKETS,
    DEFAULT,
    GemmTable,
    Shape,
    bucket,
    choose,
)
from radixmesh.worker.layers.quantization.fp8_scales import dequantize_rows

ALL = frozenset(fgc.KERNELS)
KEY = {
    "gpu": "NVIDIA Test GPU",
    "capability": "9.0",
    "torch": "2.13.0",
    "cuda": "12.8",
    "triton": "3.6.0",
    "kernels": "0123456789abcdef",
    "available": sorted(ALL),
}


class FakeMeasurer:
    """Scripted timings: `us(shape, rows)` -> kernel -> microseconds; counts its calls."""

    def __init__(self, key: dict[str, Any] | None = None, faster: str = "scaled_mm") -> None:
        self.key = dict(KEY if key is None else key)
        self.faster = faster
        self.calls: list[tuple[Shape, int]] = []

    def fingerprint(self) -> dict[str, Any]:
        return dict(self.key)

    def available(self) -> frozenset[str]:
        return frozenset(self.key["available"])

    def time(self, shape: Shape, operands: Sequence[Operand], rows: int) -> dict[str, float]:
        self.calls.append((shape, rows))
        assert operands and all(q.shape == (shape.n, shape.k) for q, _, _ in operands)
        if rows > fgt.MAX_ROWS:  # the tensor-wise GEMM wins by 10% from 256 rows on
            return {"scaled_mm": 10.0, "tensorwise_mm": 9.0 if rows >= 256 else 11.0}
        # The other kernel wins by 10% at 8 and 16 rows, loses by 10% below.
        other = 9.0 if rows >= 8 else 11.0
        return {DEFAULT: 10.0, self.faster: other}


# Per-channel bfloat16 shapes time every bucket, 1 to 8,192 rows; the others to 16.
PER_SHAPE = len(BUCKETS)
LARGE_WINS = {r for r in BUCKETS if r >= 256}  # FakeMeasurer's tensor-wise wins


def model(layout: str = "fp8-channel") -> nn.Sequential:
    """Three FP8 layers of two shapes, one method (as quantize_linears gives a model)."""
    method = fgc_method(layout)
    layers = [
        MergedColumnParallelLinear(256, [128, 128]),  # [256, 256]
        RowParallelLinear(128, 256),  # [256, 128]
        RowParallelLinear(128, 256),
    ]
    for layer in layers:
        method.create_weights(layer)
    return nn.Sequential(*layers, nn.Linear(4, 4))  # and one layer that is not FP8


def fgc_method(layout: str) -> Fp8LinearMethod:
    from radixmesh.worker.layers.quantization import linear_method

    method = linear_method(layout)
    assert isinstance(method, Fp8LinearMethod)
    return method


def method_of(m: nn.Sequential) -> Fp8LinearMethod:
    layer = m[0]
    assert isinstance(layer, MergedColumnParallelLinear)
    method = layer.linear_method
    assert isinstance(method, Fp8LinearMethod)
    return method


@pytest.fixture(autouse=True)
def _switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fgc.TABLE_SWITCH, raising=False)
    monkeypatch.delenv(fgc.SMALL_M_SWITCH, raising=False)
    monkeypatch.delenv("RADIXMESH_FUSED_KERNELS", raising=False)


def run(m: nn.Module, measurer: FakeMeasurer, tmp_path: Path, **kw: Any) -> fgc.Report:
    kw.setdefault("shipped_dir", tmp_path / "shipped")
    kw.setdefault("cache_dir", tmp_path / "cache")
    report = prepare(m, torch.bfloat16, measurer, **kw)
    assert report is not None
    return report


def test_rows_go_to_the_smallest_bucket_at_least_as_large() -> None:
    assert BUCKETS == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    expected = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 7: 8, 8: 8, 9: 16, 15: 16, 16: 16, 17: 32}
    expected |= {300: 512, 1024: 1024, 1025: 2048, 8191: 8192, 8192: 8192}
    assert {t: bucket(t) for t in expected} == expected
    assert [fgt.BUCKET_OF[t] for t in range(1, 8193)] == [bucket(t) for t in range(1, 8193)]
    for bad in (0, 8193):
        with pytest.raises(ValueError):
            bucket(bad)
    assert fgt.buckets_for("channel", "bfloat16") == BUCKETS
    assert fgt.buckets_for("group", "bfloat16") == fgt.buckets_for("channel", "float16")
    assert fgt.buckets_for("group", "float16") == (1, 2, 4, 8, 16)


def test_a_kernel_replaces_the_default_only_beyond_the_margin() -> None:
    assert fgt.MARGIN == 0.05
    assert choose({"small_m": 100.0, "scaled_mm": 96.0}, ALL) == "small_m"  # 4% faster
    assert choose({"small_m": 100.0, "scaled_mm": 95.0}, ALL) == "small_m"  # the margin itself
    assert choose({"small_m": 100.0, "scaled_mm": 90.0}, ALL) == "scaled_mm"  # 10% faster
    assert choose({"small_m": 100.0, "scaled_mm": 90.0, "cuda_gemv": 80.0}, ALL) == "cuda_gemv"
    # A kernel not available here (a shipped table's) is not chosen.
    assert choose({"small_m": 100.0, "cuda_gemv": 50.0}, {"small_m", "scaled_mm"}) == "small_m"
    # The default did not run: the fastest that did; nothing ran: no choice.
    assert choose({"scaled_mm": 30.0, "cuda_gemv": 20.0}, ALL) == "cuda_gemv"
    assert choose({}, ALL) is None
    # Past 16 rows the default is row-wise scaled_mm.
    large = {"scaled_mm": 100.0, "tensorwise_mm": 96.0}
    assert choose(large, ALL, "scaled_mm") == "scaled_mm"
    assert choose({**large, "tensorwise_mm": 90.0}, ALL, "scaled_mm") == "tensorwise_mm"


def test_the_table_answers_a_call_by_shape_layout_dtype_and_bucket() -> None:
    timings = {
        (256, 128, "channel", "bfloat16", 4): {"small_m": 10.0, "scaled_mm": 8.0},
        (256, 128, "channel", "bfloat16", 8): {"small_m": 10.0, "scaled_mm": 9.8},
        (256, 128, "group", "bfloat16", 4): {"small_m": 10.0, "cuda_gemv": 7.0},
        (256, 128, "channel", "bfloat16", 256): {"scaled_mm": 10.0, "tensorwise_mm": 8.0},
        (256, 128, "channel", "bfloat16", 512): {"scaled_mm": 10.0, "tensorwise_mm": 9.8},
        # A small-batch kernel's time at a large bucket (a hand-edited file) is not a choice.
        (256, 128, "channel", "bfloat16", 1024): {"scaled_mm": 10.0, "small_m": 1.0},
    }
    table = GemmTable(timings, ALL)
    assert table.choices == {
        (256, 128, "channel", "bfloat16", 4): "scaled_mm",
        (256, 128, "group", "bfloat16", 4): "cuda_gemv",
        (256, 128, "channel", "bfloat16", 256): "tensorwise_mm",
    }
    q = torch.zeros(256, 128, dtype=torch.float8_e4m3fn)
    channel, group = torch.ones(256), torch.ones(256, 1)
    bf16, fp16 = torch.bfloat16, torch.float16
    answers = {1: None, 3: "scaled_mm", 4: "scaled_mm", 5: None, 16: None, 17: None}
    answers |= {129: "tensorwise_mm", 256: "tensorwise_mm", 257: None, 1000: None, 9000: None}
    for rows, expected in answers.items():
        assert table.kernel_for(rows, bf16, q, channel) == expected, rows
    assert table.kernel_for(0, bf16, q, channel) is None
    assert table.kernel_for(3, bf16, q, group) == "cuda_gemv"
    assert table.kernel_for(3, fp16, q, channel) is None
    shape = Shape(256, 128, "channel", "bfloat16")
    assert [table.kernel(shape, r) for r in BUCKETS] == [DEFAULT, DEFAULT, "scaled_mm"] + [
        DEFAULT
    ] * 2 + ["scaled_mm"] * 3 + ["tensorwise_mm"] + ["scaled_mm"] * 5
    (line,) = table.describe([shape])
    assert "4: scaled_mm (small_m 10.0 scaled_mm 8.0)" in line and "1: small_m (not timed)" in line
    assert "256: tensorwise_mm (scaled_mm 10.0 tensorwise_mm 8.0)" in line


def test_the_models_fp8_shapes_and_its_method_get_the_table(tmp_path: Path) -> None:
    m = model()
    shapes = fgc.fp8_layers(m, torch.bfloat16)
    assert {s: len(v) for s, v in shapes.items()} == {
        Shape(256, 256, "channel", "bfloat16"): 1,
        Shape(256, 128, "channel", "bfloat16"): 2,
    }
    group = fgc.fp8_layers(model("fp8-1x128"), torch.float16)
    assert set(group) == {Shape(256, 256, "group", "float16"), Shape(256, 128, "group", "float16")}
    measurer = FakeMeasurer()
    report = run(m, measurer, tmp_path)
    assert sorted(measurer.calls) == sorted((s, r) for s in shapes for r in BUCKETS)
    assert method_of(m).gemm_table is report.table
    assert report.table is not None and report.measured == 2 * PER_SHAPE and report.cached == 0
    assert report.table.choices == {s.at(r): "scaled_mm" for s in shapes for r in (8, 16)} | {
        s.at(r): "tensorwise_mm" for s in shapes for r in LARGE_WINS
    }
    assert len(report.lines) == 2
    assert prepare(nn.Linear(4, 4), torch.bfloat16, measurer) is None  # no FP8 layer


def test_the_cache_is_reused_and_a_changed_key_measures_again(tmp_path: Path) -> None:
    first = FakeMeasurer()
    report = run(model(), first, tmp_path)
    assert report.cache_file == tmp_path / "cache" / "nvidia-test-gpu.json"
    back = read_table(report.cache_file)
    assert back is not None and back[0] == KEY
    assert report.table is not None and back[1] == report.table.timings
    # A second start: nothing timed, the same table.
    second = FakeMeasurer()
    again = run(model(), second, tmp_path)
    assert second.calls == [] and again.cached == 2 * PER_SHAPE and again.measured == 0
    assert again.table is not None and again.table.choices == report.table.choices
    # Another kernel source (or torch, triton, GPU ...): timed again, and the file rewritten.
    third = FakeMeasurer({**KEY, "kernels": "fedcba9876543210"}, faster="cuda_gemv")
    changed = run(model(), third, tmp_path)
    assert len(third.calls) == 2 * PER_SHAPE and changed.measured == 2 * PER_SHAPE
    assert changed.cached == 0 and changed.table is not None
    assert set(changed.table.choices.values()) == {"cuda_gemv", "tensorwise_mm"}
    rewritten = read_table(report.cache_file)
    assert rewritten is not None and rewritten[0]["kernels"] == "fedcba9876543210"


def test_a_new_shape_is_measured_and_merged_into_the_cache(tmp_path: Path) -> None:
    run(model(), FakeMeasurer(), tmp_path)
    layer = RowParallelLinear(512, 64)
    fgc_method("fp8").create_weights(layer)
    other = nn.Sequential(layer)
    measurer = FakeMeasurer()
    report = run(other, measurer, tmp_path)
    assert {s for s, _ in measurer.calls} == {Shape(64, 512, "channel", "bfloat16")}
    assert report.measured == PER_SHAPE
    back = read_table(tmp_path / "cache" / "nvidia-test-gpu.json")
    assert back is not None and len(back[1]) == 3 * PER_SHAPE  # both models' entries


def test_a_corrupt_cache_is_ignored_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cache" / "nvidia-test-gpu.json"
    path.parent.mkdir(parents=True)
    for text in ("{not json", json.dumps({"format": 1, "key": KEY, "entries": [{"n": 1}]})):
        path.write_text(text)
        fgc._warned.clear()
        with caplog.at_level(logging.WARNING, logger=fgc.__name__):
            caplog.clear()
            assert read_table(path) is None
            assert read_table(path) is None
        assert len([r for r in caplog.records if "ignored" in r.getMessage()]) == 1
    measurer = FakeMeasurer()
    report = run(model(), measurer, tmp_path)
    assert len(measurer.calls) == 2 * PER_SHAPE and report.table is not None
    assert read_table(path) is not None  # replaced by a good one


def test_files_round_trip(tmp_path: Path) -> None:
    timings = {
        (6144, 4096, "channel", "bfloat16", 1): {"small_m": 13.8, "scaled_mm": 21.0},
        (4096, 14336, "group", "float16", 16): {"small_m": 24.9},
        (4096, 4096, "channel", "bfloat16", 2): {},
    }
    path = tmp_path / "t.json"
    write_table(path, KEY, timings)
    assert read_table(path) == (KEY, timings)
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary left behind


@pytest.mark.parametrize(
    ("env", "value"),
    [
        (fgc.TABLE_SWITCH, "0"),
        (fgc.SMALL_M_SWITCH, "0"),
        (fgc.SMALL_M_SWITCH, "cuda"),
        ("RADIXMESH_FUSED_KERNELS", "0"),
    ],
)
def test_switches_keep_the_fixed_rule(
    env: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = model()
    run(m, FakeMeasurer(), tmp_path)
    assert method_of(m).gemm_table is not None
    monkeypatch.setenv(env, value)
    measurer = FakeMeasurer()
    report = run(m, measurer, tmp_path)
    assert measurer.calls == [] and report.table is None and f"{env}={value}" in report.reason
    assert method_of(m).gemm_table is None
    assert report.summary().startswith("FP8 GEMM table off")


def test_the_switches_default_values_build_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(fgc.TABLE_SWITCH, "1")
    monkeypatch.setenv(fgc.SMALL_M_SWITCH, "1")
    report = run(model(), FakeMeasurer(), tmp_path)
    assert report.table is not None and report.measured == 2 * PER_SHAPE


def test_deterministic_mode_measures_nothing(tmp_path: Path) -> None:
    m = model()
    measurer = FakeMeasurer()
    report = run(m, measurer, tmp_path, deterministic=True)
    assert measurer.calls == [] and report.table is None and "deterministic" in report.reason
    assert method_of(m).gemm_table is None
    assert not (tmp_path / "cache").exists()


def test_float32_activations_measure_nothing(tmp_path: Path) -> None:
    measurer = FakeMeasurer()
    report = prepare(model(), torch.float32, measurer, cache_dir=tmp_path)
    assert report is not None and report.table is None and measurer.calls == []


def test_a_shipped_table_comes_first(tmp_path: Path) -> None:
    shipped = tmp_path / "shipped" / "nvidia-test-gpu.json"
    shape = Shape(256, 128, "channel", "bfloat16")
    # Measured with another torch and triton (not compared), the same kernels: used.
    ship_key = {**KEY, "torch": "2.9.0", "triton": "3.5.0", "available": ["small_m"]}
    small = fgt.SMALL_BUCKETS
    ship = {shape.at(r): {"small_m": 10.0, "cuda_gemv": 5.0} for r in small}
    ship |= {shape.at(r): {"scaled_mm": 10.0, "tensorwise_mm": 5.0} for r in fgt.LARGE_BUCKETS}
    write_table(shipped, ship_key, ship)
    # The cache says otherwise for the same entries; the shipped table wins.
    write_table(
        tmp_path / "cache" / "nvidia-test-gpu.json", KEY, {e: {"small_m": 1.0} for e in ship}
    )
    measurer = FakeMeasurer()
    report = run(model(), measurer, tmp_path)
    assert {s for s, _ in measurer.calls} == {Shape(256, 256, "channel", "bfloat16")}
    assert report.shipped == PER_SHAPE and report.measured == PER_SHAPE and report.cached == 0
    assert report.table is not None
    large = ["tensorwise_mm"] * len(fgt.LARGE_BUCKETS)
    assert [report.table.kernel(shape, r) for r in BUCKETS] == ["cuda_gemv"] * 5 + large
    # Not where this machine has no CUDA kernel.
    no_gemv = FakeMeasurer({**KEY, "available": ["small_m", "scaled_mm", "tensorwise_mm"]})
    report = run(model(), no_gemv, tmp_path)
    assert report.table is not None
    assert [report.table.kernel(shape, r) for r in BUCKETS] == [DEFAULT] * 5 + large
    # Another kernel source: ignored, measured.
    write_table(shipped, {**ship_key, "kernels": "ffffffffffffffff"}, ship)
    fgc._warned.clear()
    later = FakeMeasurer()
    report = run(model(), later, tmp_path, cache_dir=tmp_path / "other-cache")
    assert len(later.calls) == 2 * PER_SHAPE and report.shipped == 0


def test_the_gpu_name_as_a_file_name() -> None:
    assert fgc.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert fgc.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert fgc.cache_path("NVIDIA H200", Path("/c")) == Path("/c/nvidia-h200.json")


def test_the_key_hashes_the_kernel_sources() -> None:
    names = {p.name for p in fgc.kernel_sources()}
    assert {"fp8_small_m.py", "fp8_gemv_cuda.py", "fp8_gemv.cu", "fp8_quant.py"} <= names
    assert "fp8_epilogue.py" in names
    assert len(fgc.sources_hash()) == 16 and fgc.sources_hash() == fgc.sources_hash()


# ---- CUDA -------------------------------------------------------------------------------

CUDA = torch.cuda.is_available()
GPU_SHAPES = [(512, 1024), (1024, 2048)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _operands(n: int, k: int, layout: str) -> list[Operand]:
    from radixmesh.worker.layers.quantization.fp8_scales import quantize

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    out: list[Operand] = []
    for _ in range(3):
        w = torch.randn(n, k, device="cuda", generator=gen) * 0.02
        # The table's "group" key: per-token groups of 128 columns (1 x 128 blocks).
        q, scale = quantize(w, "1x128" if layout == "group" else layout)
        out.append((q, scale, None))
    return out


def _reference(kernel: str, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if kernel in ("scaled_mm", "tensorwise_mm"):  # the GEMM on its per-token quantized rows
        xq, xs = quantize_rows(x.float())
        return fp8_linear_ref(dequantize_rows(xq, xs, torch.float32), q, scale, None)
    return fp8_linear_ref(x.float(), q, scale, None)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_measured_tables_every_choice_gives_the_reference() -> None:
    measurer = fgc.CudaMeasurer(torch.device("cuda"))
    shapes = {
        Shape(n, k, layout, "bfloat16"): _operands(n, k, layout)
        for n, k in GPU_SHAPES
        for layout in ("channel", "group")
    }
    timings = fgc.measure(shapes, measurer)
    assert set(timings) == {s.at(r) for s in shapes for r in s.buckets}
    # Every entry timed its default; per-channel ones past 16 rows both _scaled_mm forms.
    assert all(fgt.default_for(e[4]) in us for e, us in timings.items()), timings
    large = [us for e, us in timings.items() if e[4] > fgt.MAX_ROWS]
    assert large and all(set(us) == {"scaled_mm", "tensorwise_mm"} for us in large), large
    table = GemmTable(timings, measurer.available())
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape, ops in shapes.items():
        q, scale, _ = ops[0]
        for rows in [*range(1, 17), 17, 100, 256, 600]:
            x = torch.randn(rows, shape.k, device="cuda", generator=gen).to(torch.bfloat16)
            kernel = table.kernel(shape, rows)
            if shape.layout == "group" and rows > fgt.MAX_ROWS:
                kernel = "dequantize"  # group scales past 16 rows: fp8_linear_ref's path
            out = fp8_linear(x, q, scale, None, table)
            err = _rel(out, _reference(kernel, x, q, scale))
            assert out.dtype == torch.bfloat16 and err < 4e-3, (shape, rows, kernel, err)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_fp8_linear_takes_the_kernel_the_table_names() -> None:
    n, k = GPU_SHAPES[1]
    q, scale, _ = _operands(n, k, "channel")[0]
    x = torch.randn(5, k, device="cuda").to(torch.bfloat16)
    key = (n, k, "channel", "bfloat16", 8)
    forced = GemmTable({key: {"small_m": 10.0, "scaled_mm": 1.0}}, ALL)
    if fgc.CudaMeasurer(torch.device("cuda")).available() >= {"scaled_mm"}:
        got = fp8_linear(x, q, scale, None, forced)
        assert torch.equal(got, fp8_linear_scaled_mm(x, q, scale, None))
    from radixmesh.worker.layers.kernels.fp8_small_m import fp8_small_m_linear

    assert torch.equal(fp8_linear(x, q, scale, None), fp8_small_m_linear(x, q, scale, None))
    # Past 16 rows: the tensor-wise form where the table names it, for 16-bit rows and for
    # rows a fused kernel quantized; row-wise without a table.
    x = torch.randn(300, k, device="cuda").to(torch.bfloat16)
    tensorwise = GemmTable(
        {(n, k, "channel", "bfloat16", 512): {"scaled_mm": 9.0, "tensorwise_mm": 1.0}}, ALL
    )
    want = fp8_linear_tensorwise(x, q, scale, None)
    assert torch.equal(fp8_linear(x, q, scale, None, tensorwise), want)
    assert torch.equal(fp8_linear(x, q, scale, None), fp8_linear_scaled_mm(x, q, scale, None))
    assert _rel(want, _reference("tensorwise_mm", x, q, scale)) < 4e-3
    xq, xs = quantize_rows(x)
    quantized = Fp8Activation(xq, xs, torch.bfloat16)
    assert torch.equal(fp8_linear(quantized, q, scale, None, tensorwise), want)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_prepare_on_a_cuda_model(tmp_path: Path) -> None:
    m = model()
    m.cuda()  # in place
    fp8 = [
        layer for layer in m if isinstance(layer, (MergedColumnParallelLinear, RowParallelLinear))
    ]
    for layer in fp8:
        q, scale = quantize_rows(torch.randn(layer.weight.shape, device="cuda") * 0.02)
        layer.weight.data.copy_(q)
        layer.weight_scale.data.copy_(scale)
    measurer = fgc.CudaMeasurer(torch.device("cuda"))
    dirs: dict[str, Any] = {"cache_dir": tmp_path, "shipped_dir": tmp_path / "shipped"}
    report = prepare(m, torch.bfloat16, measurer, **dirs)
    assert report is not None and report.table is not None and report.measured == 2 * PER_SHAPE
    again = prepare(m, torch.bfloat16, measurer, **dirs)
    assert again is not None and again.measured == 0 and again.cached == 2 * PER_SHAPE
    assert again.table is not None and method_of(m).gemm_table is again.table
    row = fp8[1]
    x = torch.randn(3, 128, device="cuda").to(torch.bfloat16)
    ref = _reference(
        again.table.kernel(Shape(256, 128, "channel", "bfloat16"), 3),
        x,
        row.weight,
        row.weight_scale,
    )
    assert _rel(row(x), ref) < 4e-3
