"""The CUDA FP8 decode kernel (kernels/decode_fp8_cuda.py, cuda/decode_fp8.cu) against the
float32 reference on the pool's dequantized values and against the Triton conversion
path, which has its numerics; its launch inside a CUDA graph; its binding's parameter
block against the CUDA source."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from radixmesh.worker import cuda_library
from radixmesh.worker.attention.kernels import decode_fp8_cuda
from radixmesh.worker.attention.kernels.decode_attention import (
    FP8_CUDA_CONFIG,
    DecodeConfig,
    decode_attention,
    decode_attention_ref,
    decode_workspace,
)
from tests.worker.attention.test_triton_kernels import (
    DEVICE,
    decode_case,
    fp8_pool,
    ints,
    make_pool_case,
    rel_err,
    spread_fp8_pool,
)
from tests.worker.cuda_struct import assert_matches

LAUNCHES = [
    DecodeConfig(keys, warps, stages, cuda=True, min_blocks=mb)
    for warps, keys, stages, mb in decode_fp8_cuda.LAUNCHES
]
# (sequence lengths, query heads, KV heads, splits): tile edges (15, 16, 17), a sequence
# shorter than its splits (empty splits), groups of 1, 4 and 8 query heads per KV head.
CASES = [
    ([1, 15, 16, 17, 100], 32, 8, 1),
    ([1, 15, 16, 17, 100], 32, 8, 3),
    ([5, 777, 1500], 32, 8, 32),
    ([300, 64], 8, 8, 2),
    ([513, 40], 64, 8, 4),
    ([1000], 4, 1, 7),
]
# The conversion path's error against the float32 reference (1.7e-3 on the H200's sweep):
# fp16 operands, float32 accumulators.
TOL = 6e-3


def _case(case: int, dtype: torch.dtype, spread: bool) -> tuple:
    seq_lens, hq, hkv, splits = CASES[case]
    c = make_pool_case(
        [(n - 1, 1) for n in seq_lens], hq, hkv, 128, dtype, 900 + case, 4096, max(seq_lens) + 8
    )
    pool = spread_fp8_pool(c, 11 + case) if spread else fp8_pool(c)
    return c, seq_lens, splits, pool


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu", reason="a CUDA kernel")
@pytest.mark.parametrize("spread", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_cuda_decode_matches_reference_and_the_conversion_path(
    case: int, dtype: torch.dtype, spread: bool
) -> None:
    c, seq_lens, splits, (k8, v8, scales, (k_ref, v_ref)) = _case(case, dtype, spread)
    assert decode_fp8_cuda.applies(c["q"], k8), "the kernel must build on the GPU machine"
    ref = decode_attention_ref(c["q"], k_ref, v_ref, c["table"], c["rows"], seq_lens, 128**-0.5)
    triton_out = decode_case(c, k8, v8, seq_lens, splits, DecodeConfig(64, 4, 2), scales=scales)
    for cfg in LAUNCHES:
        out = decode_case(c, k8, v8, seq_lens, splits, cfg, scales=scales)
        assert not out.isnan().any(), cfg
        assert rel_err(out, ref) < TOL, (cfg, rel_err(out, ref))
        assert rel_err(out, triton_out) < TOL, (cfg, rel_err(out, triton_out))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu", reason="a CUDA kernel")
def test_cuda_decode_is_the_default_over_an_fp8_pool() -> None:
    c, seq_lens, splits, (k8, v8, scales, _) = _case(2, torch.bfloat16, False)
    default = decode_case(c, k8, v8, seq_lens, splits, None, scales=scales)  # type: ignore[arg-type]
    chosen = decode_case(c, k8, v8, seq_lens, splits, FP8_CUDA_CONFIG, scales=scales)
    assert torch.equal(default, chosen)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu", reason="a CUDA kernel")
@pytest.mark.parametrize("splits", [1, 3])
def test_cuda_decode_follows_scores_that_rise_along_the_sequence(splits: int) -> None:
    """Scores rising by 60 (natural log units) over 1,000 keys, with a few spikes above
    their neighbours: the kernel's softmax references are raised many times mid-sequence
    (each tile may pass them by 2^8 before they move), and the result is still the
    reference's."""
    seq_lens = [1000, 333]
    c = make_pool_case([(n - 1, 1) for n in seq_lens], 32, 8, 128, torch.bfloat16, 77, 2048, 1008)
    gen = torch.Generator().manual_seed(5)
    c["q"] = torch.ones_like(c["q"])  # key p's score: its level x 128 x 128**-0.5
    for row, n in zip(c["rows"], seq_lens, strict=True):
        slots = c["table"][row, :n].cpu()
        level = torch.linspace(-20.0, 40.0, n) / 128**0.5
        level[torch.tensor([n // 3, n // 2, n - 7])] += 3.0 / 128**0.5  # spikes
        noise = 0.3 * torch.randn(n, 8, 128, generator=gen)
        keys = level[:, None, None] + noise
        c["k_buf"][slots.to(DEVICE)] = keys.to(DEVICE, torch.bfloat16)
    k8, v8, scales, (k_ref, v_ref) = fp8_pool(c)
    ref = decode_attention_ref(c["q"], k_ref, v_ref, c["table"], c["rows"], seq_lens, 128**-0.5)
    for cfg in LAUNCHES:
        out = decode_case(c, k8, v8, seq_lens, splits, cfg, scales=scales)
        assert not out.isnan().any(), cfg
        assert rel_err(out, ref) < TOL, (cfg, rel_err(out, ref))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu", reason="a CUDA kernel")
def test_cuda_decode_replays_in_a_cuda_graph() -> None:
    """Captured once, replayed over new queries and new lengths: the eager launch's bits."""
    c, seq_lens, splits, (k8, v8, scales, _) = _case(2, torch.bfloat16, False)
    q = c["q"].clone()
    lens = ints(seq_lens)
    rows = ints(c["rows"])
    out = torch.empty_like(q)
    ws = decode_workspace(q.shape[0], q.shape[1], 128, splits, q.device)

    def run() -> None:
        decode_attention(
            q, k8, v8, out, c["table"], rows, lens, 128**-0.5, splits, ws,
            scales=scales, config=FP8_CUDA_CONFIG,
        )  # fmt: skip

    run()  # loads the library outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    gen = torch.Generator(device=q.device).manual_seed(3)
    q.copy_(torch.randn(q.shape, generator=gen, device=q.device, dtype=q.dtype))
    lens.copy_(ints([n // 2 + 1 for n in seq_lens]))
    graph.replay()
    replayed = out.clone()
    run()
    assert torch.equal(replayed, out)


def test_parameter_block_matches_the_cuda_struct() -> None:
    """ctypes' `_Params` names the CUDA `Params` fields in their order, with their sizes."""
    assert_matches(decode_fp8_cuda._Params, decode_fp8_cuda.SOURCE.read_text(), "Params")


def test_kernel_does_not_apply_off_cuda_or_when_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q = torch.zeros(2, 32, 128, dtype=torch.bfloat16)
    k = torch.zeros(10, 8, 128, dtype=torch.float8_e4m3fn)
    assert not decode_fp8_cuda.applies(q, k)  # a CPU tensor
    monkeypatch.setenv(decode_fp8_cuda.SWITCH, "triton")
    assert not decode_fp8_cuda.applies(q, k)


@pytest.mark.skipif(cuda_library.nvcc() is None, reason="needs nvcc (no GPU)")
def test_library_builds_ahead_of_time_and_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m ...decode_fp8_cuda 9.0` builds the library where RADIXMESH_CUDA_CACHE
    says, under the name the loader looks for, exporting the entry points with the
    parameter block ctypes builds; a second build keeps the file."""
    monkeypatch.setenv("RADIXMESH_CUDA_CACHE", str(tmp_path))
    decode_fp8_cuda.main(["9.0"])
    path = cuda_library.library_path(decode_fp8_cuda.SOURCE, (9, 0), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    lib = ctypes.CDLL(str(path))
    assert lib.radixmesh_decode_fp8_params_size() == ctypes.sizeof(decode_fp8_cuda._Params)
    assert hasattr(lib, "radixmesh_decode_fp8_split")
    built = path.stat().st_mtime_ns
    assert cuda_library.build(decode_fp8_cuda.SOURCE, (9, 0), "/nonexistent/nvcc", tmp_path) == path
    assert path.stat().st_mtime_ns == built


def test_shapes_that_do_not_fit_take_the_triton_kernels() -> None:
    """Head dim 128, at most 8 query heads per KV head, 16-bit queries, 16-byte aligned
    rows: anything else is not the CUDA kernel's."""
    fp8 = torch.float8_e4m3fn
    pool = torch.zeros(10, 8, 128, dtype=fp8)
    q = torch.zeros(4, 32, 128, dtype=torch.bfloat16)
    assert decode_fp8_cuda.shapes_fit(q, pool)
    assert decode_fp8_cuda.shapes_fit(q.half(), pool)
    assert not decode_fp8_cuda.shapes_fit(q.float(), pool)  # float32 queries
    assert not decode_fp8_cuda.shapes_fit(q, pool.to(torch.bfloat16))  # not an FP8 pool
    assert not decode_fp8_cuda.shapes_fit(
        torch.zeros(4, 32, 64, dtype=torch.bfloat16), torch.zeros(10, 8, 64, dtype=fp8)
    )  # head dim
    assert not decode_fp8_cuda.shapes_fit(torch.zeros(4, 72, 128, dtype=torch.bfloat16), pool)
    fused = torch.zeros(4, 48 * 128, dtype=torch.bfloat16)  # q, k, v of one projection
    assert decode_fp8_cuda.shapes_fit(fused[:, : 32 * 128].view(4, 32, 128), pool)
    shifted = torch.zeros(4 * 32 * 128 + 4, dtype=torch.bfloat16)[4:].view(4, 32, 128)
    assert not decode_fp8_cuda.shapes_fit(shifted, pool)  # rows off 16-byte alignment
