"""The small-batch FP8 kernel's variants against dequantize-then-matmul in float32: the
gemv tile (no tl.dot, rows padded only to a power of two), persistent grids, and weight
scales per row and 128 input columns (1 x 128 and 128 x 128 blocks, held per row), with
K tiles narrower than, equal to and wider than a scale group, alone and with split-K.

On CPU in triton's interpreter at small shapes, in float32; on CUDA in bfloat16 at
Llama-3-8B's shapes (gpu-marked).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixmesh.worker.layers.kernels.fp8_small_m import (
    CONFIGS,
    MAX_ROWS,
    MEASURED,
    ROW_CONFIGS,
    LaunchConfig,
    config_for,
    fp8_small_m_linear,
    row_bucket,
)
from radixmesh.worker.layers.quantization.fp8_scales import dequantize_rows, quantize

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="triton's interpreter on CPU tensors: machines without CUDA"
)


def operands(
    rows: int, n: int, k: int, layout: str, with_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(rows * n + k)
    x = torch.randn(rows, k, generator=gen)
    # Columns of very different sizes, so that group scales differ from the row's.
    w = (
        torch.randn(n, k, generator=gen)
        * torch.logspace(-2, 1, k)[torch.randperm(k, generator=gen)]
    )
    q, scale = quantize(w, layout)
    bias = torch.randn(n, generator=gen) if with_bias else None
    return x.to(DEVICE), q.to(DEVICE), scale.to(DEVICE), None if bias is None else bias.to(DEVICE)


def reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    w = dequantize_rows(q, scale.float(), torch.float32)
    return F.linear(x.float(), w, None if bias is None else bias.float())


def cfg(block_k: int, split_k: int = 1, variant: str = "dot", persistent: int = 0) -> LaunchConfig:
    return LaunchConfig(16, block_k, split_k, 1, 1, variant=variant, programs_per_sm=persistent)


@interpreter
@pytest.mark.parametrize("variant", ["dot", "gemv"])
@pytest.mark.parametrize("layout", ["channel", "1x128", "128x128"])
# K tiles of 32 (4 a group), 128 (one) and 256 (two groups a tile); k=300: a partial group
@pytest.mark.parametrize("block_k", [32, 128, 256])
def test_variants_and_scale_layouts_match_the_reference(
    variant: str, layout: str, block_k: int
) -> None:
    for rows, with_bias in ((1, True), (3, False), (MAX_ROWS, True)):
        x, q, scale, bias = operands(rows, 40, 300, layout, with_bias)
        out = fp8_small_m_linear(x, q, scale, bias, cfg(block_k, variant=variant))
        assert out.dtype == torch.float32 and out.shape == (rows, 40)
        torch.testing.assert_close(out, reference(x, q, scale, bias), rtol=1e-4, atol=1e-4)


@interpreter
@pytest.mark.parametrize("variant", ["dot", "gemv"])
@pytest.mark.parametrize("layout", ["channel", "1x128"])
@pytest.mark.parametrize("split_k", [2, 4])
def test_split_k_with_group_scales(variant: str, layout: str, split_k: int) -> None:
    # k=520: 5 groups; slices are whole groups (2 or 1 of them), the last one partial
    x, q, scale, bias = operands(5, 40, 520, layout, True)
    out = fp8_small_m_linear(x, q, scale, bias, cfg(32, split_k, variant))
    torch.testing.assert_close(out, reference(x, q, scale, bias), rtol=1e-4, atol=1e-4)


@interpreter
@pytest.mark.parametrize("split_k", [1, 3])
def test_a_persistent_grid_covers_every_tile(split_k: int) -> None:
    # Off CUDA a persistent grid has 132 programs per programs_per_sm: 2200 columns make
    # 138 blocks of 16 (x split_k slices), so programs 0-5 (or more) take a second tile.
    x, q, scale, bias = operands(4, 2200, 256, "1x128", True)
    out = fp8_small_m_linear(x, q, scale, bias, cfg(128, split_k, "gemv", persistent=1))
    torch.testing.assert_close(out, reference(x, q, scale, bias), rtol=1e-4, atol=1e-4)


@interpreter
def test_group_scaled_split_k_gives_the_same_bits_every_call() -> None:
    x, q, scale, bias = operands(MAX_ROWS, 40, 520, "128x128", True)
    first = fp8_small_m_linear(x, q, scale, bias, cfg(128, 4, "gemv"))
    second = fp8_small_m_linear(x, q, scale, bias, cfg(128, 4, "gemv"))
    assert torch.equal(first.view(torch.int32), second.view(torch.int32))


def test_configs_by_row_bucket() -> None:
    assert [row_bucket(t) for t in (1, 2, 4, 5, 16)] == [1, 4, 4, 16, 16]
    shape = (4096, 4096)
    gemv = LaunchConfig(block_n=16, block_k=512, split_k=8, variant="gemv")
    assert config_for(*shape, rows=1) is CONFIGS[shape]
    ROW_CONFIGS[(*shape, 1)] = gemv
    try:
        assert config_for(*shape, rows=1) is gemv
        assert config_for(*shape, rows=2) is CONFIGS[shape]
    finally:
        del ROW_CONFIGS[(*shape, 1)]
    assert config_for(96, 300, rows=1) is MEASURED


def test_launch_config_checks_the_new_fields() -> None:
    with pytest.raises(ValueError, match="variant"):
        LaunchConfig(block_n=32, block_k=256, variant="mma")
    with pytest.raises(ValueError, match="programs_per_sm"):
        LaunchConfig(block_n=32, block_k=256, programs_per_sm=-1)
    c = LaunchConfig(block_n=16, block_k=512, split_k=8, variant="gemv", programs_per_sm=4)
    assert c.entry() == (
        "LaunchConfig(block_n=16, block_k=512, split_k=8, num_warps=4, num_stages=4, "
        "variant='gemv', programs_per_sm=4)"
    )
    assert eval(c.entry(), {"LaunchConfig": LaunchConfig}) == c


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("variant", ["dot", "gemv"])
@pytest.mark.parametrize("layout", ["channel", "1x128"])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 14336)])
def test_bfloat16_variants_at_llama_shapes(variant: str, layout: str, n: int, k: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    q, scale = quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.02, layout)
    for block_k, split_k, persistent in ((128, 4, 0), (256, 1, 4), (512, 8, 0)):
        c = LaunchConfig(32, block_k, split_k, 4, 3, variant=variant, programs_per_sm=persistent)
        for rows in (1, 4, MAX_ROWS):
            x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
            out = fp8_small_m_linear(x, q, scale, None, c)
            ref = reference(x, q, scale, None)
            err = float((out.float() - ref).norm() / ref.norm())
            assert out.dtype == torch.bfloat16 and err < 4e-3, (c, rows, err)
