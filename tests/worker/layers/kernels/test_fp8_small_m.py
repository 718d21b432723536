"""The small-batch FP8 kernel against dequantize-then-matmul in float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixmesh.worker.layers.kernels.fp8_small_m import MAX_ROWS, fp8_small_m_linear
from radixmesh.worker.layers.quantization.fp8 import quantize_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    w = q.float() * scale.float()[:, None]
    return F.linear(x.float(), w, None if bias is None else bias.float())


@pytest.mark.parametrize(
    "rows,n,k,with_bias", [(1, 96, 300, True), (5, 64, 512, False), (MAX_ROWS, 40, 257, True)]
)
def test_float32_matches_the_reference(rows: int, n: int, k: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows * n + k)
    x = torch.randn(rows, k, generator=gen).to(DEVICE)
    q, scale = quantize_rows(torch.randn(n, k, generator=gen).to(DEVICE))
    bias = torch.randn(n, generator=gen).to(DEVICE) if with_bias else None
    out = fp8_small_m_linear(x, q, scale, bias)
    assert out.dtype == torch.float32 and out.shape == (rows, n)
    # Only the order of the float32 sums differs (tf32 is off for float32 dots here).
    torch.testing.assert_close(out, reference(x, q, scale, bias), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bfloat16_at_llama_shapes() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in ((6144, 4096), (4096, 14336)):
        for rows in (1, 7, MAX_ROWS):
            x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
            q, scale = quantize_rows(torch.randn(n, k, device="cuda", generator=gen) * 0.02)
            out = fp8_small_m_linear(x, q, scale, None)
            ref = reference(x, q, scale, None)
            err = float((out.float() - ref).norm() / ref.norm())
            assert out.dtype == torch.bfloat16 and err < 4e-3, (n, k, rows, err)


def test_empty_batch() -> None:
    q, scale = quantize_rows(torch.randn(32, 64).to(DEVICE))
    assert fp8_small_m_linear(torch.empty(0, 64, device=DEVICE), q, scale, None).shape == (0, 32)
