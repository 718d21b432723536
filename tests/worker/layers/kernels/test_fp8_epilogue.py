"""The tensor-wise FP8 GEMM's epilogue (row and column scales, bias, one rounding) against
its PyTorch expression, bit for bit, in triton's interpreter on CPU or on CUDA."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.layers.kernels.fp8_epilogue import scale_rows_cols, scale_rows_cols_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(("m", "n"), [(1, 16), (17, 300), (40, 512)])  # ragged tiles too
def test_bits_equal_the_reference(dtype: torch.dtype, with_bias: bool, m: int, n: int) -> None:
    gen = torch.Generator().manual_seed(m * n)
    acc = (torch.randn(m, n, generator=gen) * 1e3).to(DEVICE)
    a = torch.logspace(-5, -1, m).to(DEVICE)  # per-token scales of very different sizes
    s = (torch.rand(n, generator=gen) * 1e-2 + 1e-4).to(DEVICE)
    bias = torch.randn(n, generator=gen).to(DEVICE, dtype) if with_bias else None
    out = scale_rows_cols(acc, a, s, bias, dtype)
    ref = scale_rows_cols_ref(acc, a, s, bias, dtype)
    assert out.dtype == dtype and out.shape == (m, n)
    assert torch.equal(out, ref)


def test_strided_rows_and_empty() -> None:
    acc = torch.randn(8, 64, device=DEVICE)[:, :48]  # row stride 64, unit column stride
    a, s = torch.rand(8, device=DEVICE), torch.rand(48, device=DEVICE)
    got = scale_rows_cols(acc, a, s, None, torch.bfloat16)
    assert torch.equal(got, scale_rows_cols_ref(acc, a, s, None, torch.bfloat16))
    empty = torch.empty(0, 48, device=DEVICE)
    assert scale_rows_cols(empty, a[:0], s, None, torch.bfloat16).shape == (0, 48)


def test_bad_operands_name_what_is_wrong() -> None:
    acc = torch.zeros(4, 32, device=DEVICE)
    a, s = torch.ones(4, device=DEVICE), torch.ones(32, device=DEVICE)
    with pytest.raises(ValueError, match="acc must be float32"):
        scale_rows_cols(acc.bfloat16(), a, s, None, torch.bfloat16)
    with pytest.raises(ValueError, match="scales must be float32"):
        scale_rows_cols(acc, a[:3], s, None, torch.bfloat16)
    with pytest.raises(ValueError, match="scales must be float32"):
        scale_rows_cols(acc, a.double(), s, None, torch.bfloat16)
    with pytest.raises(ValueError, match="bias must be"):
        scale_rows_cols(acc, a, s, torch.zeros(31, device=DEVICE), torch.bfloat16)
