"""The small-batch FP8 kernel against dequantize-then-matmul in float32, its launch
configurations, and split-K's fixed summing order (the same bits every call).

On CPU the kernels run in triton's interpreter (conftest.py) at small shapes, in float32
(the interpreter's bfloat16 `tl.dot` returns garbage, triton 3.9); on CUDA the gpu tests
run the table's configs at Llama-3-8B's shapes in bfloat16.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixmesh.worker.layers.kernels.fp8_small_m import (
    CONFIGS,
    MAX_ROWS,
    MEASURED,
    PROGRAMS_PER_SM,
    LaunchConfig,
    config_for,
    fp8_small_m_linear,
    split_k_guess,
)
from radixmesh.worker.layers.quantization.fp8 import quantize_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="triton's interpreter on CPU tensors: machines without CUDA"
)
# Small tiles, so that a few hundred K columns make several tiles and slices.
SMALL = LaunchConfig(block_n=16, block_k=32, num_warps=1, num_stages=1)
# The H100 / H200's shared memory a block may take.
SHARED_LIMIT = 227 << 10


def reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    w = q.float() * scale.float()[:, None]
    return F.linear(x.float(), w, None if bias is None else bias.float())


def operands(
    rows: int, n: int, k: int, with_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(rows * n + k)
    x = torch.randn(rows, k, generator=gen).to(DEVICE)
    q, scale = quantize_rows(torch.randn(n, k, generator=gen).to(DEVICE))
    bias = torch.randn(n, generator=gen).to(DEVICE) if with_bias else None
    return x, q, scale, bias


def with_split(split_k: int) -> LaunchConfig:
    return LaunchConfig(SMALL.block_n, SMALL.block_k, split_k, SMALL.num_warps, SMALL.num_stages)


@pytest.mark.parametrize(
    "rows,n,k,with_bias", [(1, 96, 300, True), (5, 64, 512, False), (MAX_ROWS, 40, 257, True)]
)
def test_float32_matches_the_reference(rows: int, n: int, k: int, with_bias: bool) -> None:
    x, q, scale, bias = operands(rows, n, k, with_bias)
    out = fp8_small_m_linear(x, q, scale, bias)
    assert out.dtype == torch.float32 and out.shape == (rows, n)
    # Only the order of the float32 sums differs (tf32 is off for float32 dots here).
    torch.testing.assert_close(out, reference(x, q, scale, bias), rtol=1e-4, atol=1e-4)


@interpreter
@pytest.mark.parametrize("split_k", [1, 2, 4])
@pytest.mark.parametrize("rows", [1, 5, MAX_ROWS])
@pytest.mark.parametrize("with_bias", [False, True])
# k=200: neither a multiple of the K tile (32) nor of tile x slices; k=256: slices of 2 tiles
@pytest.mark.parametrize("k", [200, 256])
def test_split_k_matches_the_reference(split_k: int, rows: int, with_bias: bool, k: int) -> None:
    x, q, scale, bias = operands(rows, 40, k, with_bias)  # 40 columns: a partial block
    out = fp8_small_m_linear(x, q, scale, bias, with_split(split_k))
    assert out.dtype == torch.float32 and out.shape == (rows, 40)
    torch.testing.assert_close(out, reference(x, q, scale, bias), rtol=1e-4, atol=1e-4)


@interpreter
def test_more_slices_than_k_tiles_leaves_empty_slices_at_zero() -> None:
    # 48 columns of K in tiles of 32: slices 0 and 1 hold a tile each, slices 2-7 none.
    x, q, scale, bias = operands(3, 16, 48, True)
    out = fp8_small_m_linear(x, q, scale, bias, with_split(8))
    torch.testing.assert_close(out, reference(x, q, scale, bias), rtol=1e-4, atol=1e-4)


@interpreter
def test_split_k_gives_the_same_bits_every_call() -> None:
    x, q, scale, bias = operands(MAX_ROWS, 40, 200, True)
    first = fp8_small_m_linear(x, q, scale, bias, with_split(4))
    second = fp8_small_m_linear(x, q, scale, bias, with_split(4))
    assert torch.equal(first.view(torch.int32), second.view(torch.int32))


def test_launch_config_rejects_what_triton_cannot_tile() -> None:
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        LaunchConfig(block_n=24, block_k=256)
    with pytest.raises(ValueError, match="block_k"):
        LaunchConfig(block_n=32, block_k=8)
    with pytest.raises(ValueError, match="split_k"):
        LaunchConfig(block_n=32, block_k=256, split_k=0)
    with pytest.raises(ValueError, match="num_warps"):
        LaunchConfig(block_n=32, block_k=256, num_warps=3)


def test_entry_is_the_config_as_python_source() -> None:
    cfg = LaunchConfig(block_n=64, block_k=512, split_k=2, num_warps=8, num_stages=3)
    assert cfg.entry() == (
        "LaunchConfig(block_n=64, block_k=512, split_k=2, num_warps=8, num_stages=3)"
    )
    assert eval(cfg.entry(), {"LaunchConfig": LaunchConfig}) == cfg


@pytest.mark.parametrize(
    "n,k,want",
    [
        (6144, 4096, LaunchConfig(block_n=32, block_k=256, split_k=4)),  # 192 blocks -> 768
        (4096, 4096, LaunchConfig(block_n=32, block_k=256, split_k=4)),  # 128 -> 512
        (4096, 14336, LaunchConfig(block_n=32, block_k=256, split_k=4)),
        (28672, 4096, LaunchConfig(block_n=32, block_k=256, split_k=1)),  # 896 already
        (65536, 4096, LaunchConfig(block_n=64, block_k=256, split_k=1)),  # 1024 of 64 columns
        (4096, 2048, LaunchConfig(block_n=32, block_k=256, split_k=2)),  # slices keep 4 tiles
        (1024, 512, LaunchConfig(block_n=32, block_k=256, split_k=1)),  # too short to split
        (512, 65536, LaunchConfig(block_n=32, block_k=256, split_k=8)),  # at most 8 slices
    ],
)
def test_split_k_guess(n: int, k: int, want: LaunchConfig) -> None:
    assert split_k_guess(n, k, sms=132) == want


# Llama-3-8B's fused qkv, o, fused gate/up and down.
LLAMA_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


def test_the_guess_gives_llama_shapes_enough_programs_per_sm() -> None:
    for n, k in LLAMA_SHAPES:
        cfg = split_k_guess(n, k, sms=132)
        programs = -(-n // cfg.block_n) * cfg.split_k
        assert programs >= PROGRAMS_PER_SM * 132, (n, k, cfg, programs)


def test_table_configs_fit_and_are_found() -> None:
    for (n, k), cfg in CONFIGS.items():
        assert cfg.shared_bytes() <= SHARED_LIMIT, cfg
        assert config_for(n, k) is cfg
    # Unmeasured shapes take the config measured on the H200, never a guess.
    assert config_for(96, 300) is MEASURED
    assert LaunchConfig(block_n=32, block_k=256, split_k=1) == MEASURED


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("n", "k"), sorted({*CONFIGS, *LLAMA_SHAPES}))
def test_bfloat16_at_the_table_shapes(n: int, k: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    q, scale = quantize_rows(torch.randn(n, k, device="cuda", generator=gen) * 0.02)
    bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16) * 0.1
    for rows in (1, 7, MAX_ROWS):
        x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
        for b in (None, bias):
            out = fp8_small_m_linear(x, q, scale, b)  # the shape's config
            ref = reference(x, q, scale, b)
            err = float((out.float() - ref).norm() / ref.norm())
            assert out.dtype == torch.bfloat16 and err < 4e-3, (n, k, rows, err)
            again = fp8_small_m_linear(x, q, scale, b)
            assert torch.equal(out.view(torch.int16), again.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("split_k", [1, 4])
def test_split_k_under_cuda_graph_replays_the_eager_bits(split_k: int) -> None:
    n, k = 4096, 14336
    gen = torch.Generator(device="cuda").manual_seed(split_k)
    q, scale = quantize_rows(torch.randn(n, k, device="cuda", generator=gen) * 0.02)
    x = torch.randn(5, k, device="cuda", generator=gen).to(torch.bfloat16)
    cfg = LaunchConfig(block_n=32, block_k=256, split_k=split_k)
    eager = fp8_small_m_linear(x, q, scale, None, cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fp8_small_m_linear(x, q, scale, None, cfg)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.view(torch.int16), eager.view(torch.int16))


def test_empty_batch() -> None:
    q, scale = quantize_rows(torch.randn(32, 64).to(DEVICE))
    assert fp8_small_m_linear(torch.empty(0, 64, device=DEVICE), q, scale, None).shape == (0, 32)
