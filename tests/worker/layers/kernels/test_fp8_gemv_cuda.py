"""The CUDA FP8 small-batch GEMM (layers/kernels/fp8_gemv_cuda.py, cuda/fp8_gemv.cu)
against float32 on the dequantized weights and against the Triton small-batch kernel; its
launches inside a CUDA graph; its binding's parameter block against the CUDA source; the
switch that chooses it."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from radixmesh.worker import cuda_library
from radixmesh.worker.layers.kernels import fp8_gemv_cuda
from radixmesh.worker.layers.quantization.fp8_scales import quantize_rows
from tests.worker.cuda_struct import assert_matches

CUDA = torch.cuda.is_available()
# Llama-3-8B's four GEMMs (n, k), and one small enough to take a single K slice.
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (512, 128)]


def _case(n: int, k: int, m: int, dtype: torch.dtype, seed: int) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.02
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype)
    x[0, :7] *= 300  # an outlier channel, as Llama's first tokens have
    bias = torch.randn(n, generator=gen).to(dtype)
    q, scale = quantize_rows(w)
    return x.cuda(), q.cuda(), scale.cuda(), bias.cuda()


def _ref(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    out = F.linear(x.float(), q.float() * scale[:, None])
    return out if bias is None else out + bias.float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="a CUDA kernel")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float32_and_the_triton_kernel(
    shape: tuple[int, int], m: int, dtype: torch.dtype
) -> None:
    from radixmesh.worker.layers.kernels.fp8_small_m import fp8_small_m_linear

    n, k = shape
    x, q, scale, bias = _case(n, k, m, dtype, seed=n + k + m)
    assert fp8_gemv_cuda.shapes_fit(x, q, scale) and fp8_gemv_cuda.library(0) is not None
    for b in (None, bias):
        out = fp8_gemv_cuda.fp8_gemv_cuda(x, q, scale, b)
        assert out.dtype == dtype and out.shape == (m, n)
        ref = _ref(x, q, scale, b)
        # The output's own rounding (bf16: 2^-9) bounds the error; fp16 operands add less.
        assert _rel(out, ref) < 8e-3, _rel(out, ref)
        assert _rel(out, fp8_small_m_linear(x, q, scale, b)) < 8e-3
        for warps in fp8_gemv_cuda.WARP_COUNTS:  # any split of K: the same sums but order
            if warps * fp8_gemv_cuda.CHUNK <= k:
                for persistent in (True, False):
                    other = fp8_gemv_cuda.fp8_gemv_cuda(
                        x, q, scale, b, warps=warps, persistent=persistent
                    )
                    assert _rel(other, ref) < 8e-3, (warps, persistent, _rel(other, ref))
        # The grid does not change the sums' order: the same bits either way.
        assert torch.equal(out, fp8_gemv_cuda.fp8_gemv_cuda(x, q, scale, b, persistent=False))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="a CUDA kernel")
def test_replays_in_a_cuda_graph() -> None:
    """Captured once, replayed over new activations: the eager call's bits."""
    x, q, scale, bias = _case(4096, 4096, 5, torch.bfloat16, seed=3)
    fp8_gemv_cuda.fp8_gemv_cuda(x, q, scale, bias)  # loads the library outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_gemv_cuda.fp8_gemv_cuda(x, q, scale, bias)
    x.copy_(torch.randn(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(4)))
    graph.replay()
    assert torch.equal(out, fp8_gemv_cuda.fp8_gemv_cuda(x, q, scale, bias))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="a CUDA kernel")
def test_fp8_linear_takes_it_when_switched_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixmesh.worker.layers.quantization.fp8 import fp8_linear

    x, q, scale, bias = _case(6144, 4096, 4, torch.bfloat16, seed=5)
    calls: list[int] = []
    plain = fp8_gemv_cuda.fp8_gemv_cuda

    def counted(*args: torch.Tensor | None) -> torch.Tensor:
        calls.append(1)
        return plain(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fp8_gemv_cuda, "fp8_gemv_cuda", counted)
    fp8_linear(x, q, scale, bias)
    assert calls == []  # off by default: the Triton kernel
    monkeypatch.setenv(fp8_gemv_cuda.SWITCH, "cuda")
    out = fp8_linear(x, q, scale, bias)
    assert calls == [1] and _rel(out, _ref(x, q, scale, bias)) < 8e-3


def test_parameter_block_matches_the_cuda_struct() -> None:
    """ctypes' `_GemvParams` names the CUDA `GemvParams` fields in their order, with their
    sizes."""
    source = fp8_gemv_cuda.SOURCE.read_text()
    assert_matches(fp8_gemv_cuda._GemvParams, source, "GemvParams")


def test_shapes_and_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    fp8 = torch.float8_e4m3fn
    q = torch.zeros(64, 256, dtype=fp8)
    scale = torch.ones(64)
    x = torch.zeros(3, 256, dtype=torch.bfloat16)
    assert fp8_gemv_cuda.shapes_fit(x, q, scale)
    assert fp8_gemv_cuda.shapes_fit(x.half(), q, scale)
    assert not fp8_gemv_cuda.shapes_fit(x.float(), q, scale)  # float32 activations
    assert not fp8_gemv_cuda.shapes_fit(torch.zeros(17, 256, dtype=torch.bfloat16), q, scale)
    assert not fp8_gemv_cuda.shapes_fit(x, q, torch.ones(64, 2))  # group scales
    assert not fp8_gemv_cuda.shapes_fit(x[:, :200], q[:, :200], scale)  # k % 128
    assert not fp8_gemv_cuda.shapes_fit(x, q[:40], scale[:40])  # n % 16
    wide = torch.zeros(3, 260, dtype=torch.bfloat16)
    assert not fp8_gemv_cuda.shapes_fit(wide[:, :256], q, scale)  # rows not 16-byte aligned
    assert not fp8_gemv_cuda.shapes_fit(wide[:, 4:], q, scale)  # nor the first one
    assert fp8_gemv_cuda.shapes_fit(torch.zeros(3, 264, dtype=torch.bfloat16)[:, 8:], q, scale)
    assert not fp8_gemv_cuda.applies(x, q, scale)  # CPU tensors, and off by default
    monkeypatch.setenv(fp8_gemv_cuda.SWITCH, "cuda")
    assert not fp8_gemv_cuda.applies(x, q, scale)  # still CPU tensors


def test_warps_per_block_follow_the_measured_best() -> None:
    g = fp8_gemv_cuda
    assert g.warps_for(6144, 4096) == 4  # qkv: 384 blocks
    assert g.warps_for(4096, 4096) == 8  # o: 256 blocks
    assert g.warps_for(28672, 4096) == 4  # gate/up: 1,792 blocks, the minimum
    assert g.warps_for(4096, 14336) == 8  # down
    assert g.warps_for(512, 4096) == 8  # 32 blocks: 16 would leave 2 chunks a warp
    assert g.warps_for(512, 128) == 1 and g.warps_for(512, 1024) == 2
    for n in (16, 512, 4096, 131072):
        for k in range(128, 65536 + 1, 128):
            w = g.warps_for(n, k)
            assert w in g.WARP_COUNTS and w * g.CHUNK <= k
            assert w == 1 or w * g.CHUNKS_PER_WARP <= k // g.CHUNK


@pytest.mark.skipif(cuda_library.nvcc() is None, reason="needs nvcc (no GPU)")
def test_library_builds_ahead_of_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m ...fp8_gemv_cuda 9.0` builds the library where RADIXMESH_CUDA_CACHE says,
    exporting its entry points with the parameter block ctypes builds."""
    monkeypatch.setenv("RADIXMESH_CUDA_CACHE", str(tmp_path))
    fp8_gemv_cuda.main(["9.0"])
    path = cuda_library.library_path(fp8_gemv_cuda.SOURCE, (9, 0), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    lib = ctypes.CDLL(str(path))
    assert lib.radixmesh_fp8_gemv_params_size() == ctypes.sizeof(fp8_gemv_cuda._GemvParams)
    assert hasattr(lib, "radixmesh_fp8_gemv")
