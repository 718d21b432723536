"""The per-token FP8 quantization kernel against `quantize_rows` (bit for bit), in triton's
interpreter on CPU or on CUDA."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.layers.kernels.fp8_quant import per_token_fp8, static_fp8
from radixmesh.worker.layers.quantization.fp8 import quantize_rows
from radixmesh.worker.layers.quantization.fp8_static import quantize_static_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [16, 576, 1536, 2500])  # one block, several, a ragged tail
def test_bits_equal_the_reference(dtype: torch.dtype, k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    magnitude = torch.logspace(-4, 3, 7)[:, None]  # tokens of very different sizes
    x = (torch.randn(7, k, generator=gen) * magnitude).to(DEVICE, dtype)
    x[3] = 0  # an all-zero token: scale 1e-12, values 0
    x[5, 7] = 1e4  # an outlier sets its own token's scale only
    q, scale = per_token_fp8(x)
    q_ref, scale_ref = quantize_rows(x)
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert float(scale[3]) == float(torch.tensor(1e-12)) and not q[3].float().any()


def test_every_e4m3_rounding_case() -> None:
    # Ties, carries into the exponent (15.5 -> 16), the subnormal range and its top.
    values = torch.tensor(
        [448.0, 31.5, 15.5, 17.0, 18.0, 19.0, 0.0146484375, 0.0068359375, 2.0**-10, -3.0 * 2**-9]
    )
    row = torch.cat([values, -values]).to(DEVICE)[None, :]
    q, scale = per_token_fp8(row)
    assert float(scale[0]) == 1.0
    assert torch.equal(q.view(torch.uint8), row.to(torch.float8_e4m3fn).view(torch.uint8))


def test_empty_batch() -> None:
    q, scale = per_token_fp8(torch.empty(0, 64, device=DEVICE))
    assert q.shape == (0, 64) and scale.shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [16, 576, 2500])  # one block, several, a ragged tail
def test_static_bits_equal_the_reference(dtype: torch.dtype, k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    x = (torch.randn(5, k, generator=gen) * torch.logspace(-3, 2, 5)[:, None]).to(DEVICE, dtype)
    x[2, 3], x[4, 5] = 1e5, -1e5  # past 448 scales: saturated, not NaN
    scale = torch.tensor(0.0371, device=DEVICE)
    q = static_fp8(x, scale)
    ref = quantize_static_ref(x, scale)
    assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8))
    assert float(q[2, 3]) == 448.0 and float(q[4, 5]) == -448.0


def test_static_every_e4m3_rounding_case() -> None:
    values = torch.tensor(
        [448.0, 31.5, 15.5, 17.0, 18.0, 19.0, 0.0146484375, 0.0068359375, 2.0**-10, -3.0 * 2**-9]
    )
    row = torch.cat([values, -values]).to(DEVICE)[None, :] * 0.5  # the scale's division: exact
    q = static_fp8(row, torch.tensor(0.5, device=DEVICE))
    assert torch.equal(q.view(torch.uint8), (row * 2).to(torch.float8_e4m3fn).view(torch.uint8))


def test_static_empty_batch_and_a_scale_of_one_value() -> None:
    one = torch.tensor(1.0, device=DEVICE)
    assert static_fp8(torch.empty(0, 64, device=DEVICE), one).shape == (0, 64)
    with pytest.raises(AssertionError):
        static_fp8(torch.ones(2, 64, device=DEVICE), torch.ones(2, device=DEVICE))
