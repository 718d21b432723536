"""RMSNorm (plain and fused add) and SiLU-and-mul writing FP8 rows plus per-row scales,
against their 16-bit kernels followed by `quantize_rows` (the path they replace): the
same e4m3 bits and the same scales. In triton's interpreter on CPU (conftest.py), and
compiled on CUDA; the gpu tests add Llama-3-8B's widths at 64 and 1,024 rows. The
interpreter adds a row's squares in one order whatever the kernel stores, so it cannot
see the fused kernel hold the row in another register layout than the 16-bit kernel on
the GPU (another order, other bits): test_fused_fp8_layouts.py compiles both for sm_90
and compares them.
"""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.layers.activation import SiluAndMul
from radixmesh.worker.layers.kernels.fp8_quant import per_token_fp8
from radixmesh.worker.layers.kernels.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_fp8,
    rms_norm,
    rms_norm_fp8,
)
from radixmesh.worker.layers.kernels.silu_mul import silu_and_mul, silu_and_mul_fp8
from radixmesh.worker.layers.norm import RMSNorm
from radixmesh.worker.layers.quantization.fp8_activation import Fp8Activation
from radixmesh.worker.layers.quantization.fp8_scales import quantize_rows
from tests.worker.layers.kernels.test_fused_kernels import route_to_fused

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-5
# Rows scaled up to 300 overflow exp(-gate) to inf in SiLU (silu -> -0, as on the GPU);
# numpy, under the interpreter, warns about it.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="triton's interpreter on CPU tensors: machines without CUDA"
)


def rows(t: int, k: int, *, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Random rows of very different sizes; row 1 has a huge outlier (when t > 1)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=gen) * scale * torch.logspace(-3, 2, t)[:, None]
    if t > 1:
        x[1, k // 3] = 3e4  # squeezes the rest of its row into e4m3's subnormals
    return x.to(DEVICE, dtype)


def assert_same_fp8(
    got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]
) -> None:
    (q, scale), (q_ref, scale_ref) = got, want
    assert q.dtype == torch.float8_e4m3fn and q.shape == q_ref.shape
    assert scale.dtype == torch.float32 and scale.shape == scale_ref.shape
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "hidden"), [(1, 64), (5, 100), (4, 4000)])  # odd widths
def test_rms_norm_fp8_bits(dtype: torch.dtype, t: int, hidden: int) -> None:
    x = rows(t, hidden, dtype=dtype, seed=t)
    x[-1] = 0  # an all-zero row: normed to zeros, scale 1e-12
    w = (torch.randn(hidden, generator=torch.Generator().manual_seed(1)) + 1).to(DEVICE, dtype)
    got = rms_norm_fp8(x, w, EPS)
    assert_same_fp8(got, quantize_rows(rms_norm(x, w, EPS)))
    assert float(got[1][-1]) == float(torch.tensor(1e-12)) and not got[0][-1].float().any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "hidden"), [(2, 64), (5, 100), (4, 4000)])
def test_fused_add_rms_norm_fp8_bits_and_residual(dtype: torch.dtype, t: int, hidden: int) -> None:
    x = rows(t, hidden, dtype=dtype, seed=t + 10)
    w = (torch.randn(hidden, generator=torch.Generator().manual_seed(2)) + 1).to(DEVICE, dtype)
    # The residual is a strided view (rows of a wider buffer), updated in place.
    buf = rows(t, hidden + 8, dtype=dtype, seed=t + 20, scale=4.0)
    buf[0, :hidden] = -x[0]  # x + residual = 0: an all-zero row
    residual, before, x_before = buf[:, :hidden], buf.clone(), x.clone()
    ref_residual = before[:, :hidden].clone()
    ref_out = fused_add_rms_norm(x, ref_residual, w, EPS)  # the unfused path's kernel
    got = fused_add_rms_norm_fp8(x, residual, w, EPS)
    assert torch.equal(residual, before[:, :hidden] + x)  # the sum, as PyTorch rounds it
    assert torch.equal(residual, ref_residual)
    assert torch.equal(buf[:, hidden:], before[:, hidden:])  # nothing outside the rows
    assert torch.equal(x, x_before)
    assert_same_fp8(got, quantize_rows(ref_out))
    assert not got[0][0].float().any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "d"), [(1, 64), (5, 100), (3, 2500)])  # ragged column blocks
def test_silu_and_mul_fp8_bits(dtype: torch.dtype, t: int, d: int) -> None:
    gate_up = rows(t, 2 * d, dtype=dtype, seed=t + 30, scale=3.0)
    gate_up[-1, d:] = 0  # up = 0: an all-zero product row
    got = silu_and_mul_fp8(gate_up)
    assert_same_fp8(got, quantize_rows(silu_and_mul(gate_up)))
    assert not got[0][-1].float().any()


@pytest.mark.parametrize(("block", "num_warps"), [(256, 2), (2048, 8)])
def test_silu_and_mul_fp8_launches_agree(block: int, num_warps: int) -> None:
    gate_up = rows(3, 2 * 2500, dtype=torch.bfloat16, seed=40, scale=3.0)
    got = silu_and_mul_fp8(gate_up, block=block, num_warps=num_warps)
    assert_same_fp8(got, quantize_rows(silu_and_mul(gate_up)))


def test_quantizing_kernels_match_per_token_fp8() -> None:
    # The shared quantization steps: the standalone kernel's bits too.
    x = rows(4, 300, dtype=torch.bfloat16, seed=50)
    w = torch.ones(300, dtype=torch.bfloat16, device=DEVICE)
    assert_same_fp8(rms_norm_fp8(x, w, EPS), per_token_fp8(rms_norm(x, w, EPS)))


def test_empty_batch() -> None:
    w = torch.ones(64, device=DEVICE)
    for q, scale in (
        rms_norm_fp8(torch.empty(0, 64, device=DEVICE), w, EPS),
        fused_add_rms_norm_fp8(
            torch.empty(0, 64, device=DEVICE), torch.empty(0, 64, device=DEVICE), w, EPS
        ),
        silu_and_mul_fp8(torch.empty(0, 128, device=DEVICE)),
    ):
        assert q.shape == (0, 64) and scale.shape == (0,)


def check_layers(dtype: torch.dtype) -> None:
    """RMSNorm and SiluAndMul with quantize=True give `Fp8Activation.quantize` of their
    16-bit output, and the fused add still updates the residual."""
    x, res = rows(5, 96, dtype=dtype, seed=60), rows(5, 96, dtype=dtype, seed=61)
    norm = RMSNorm(96, EPS, dtype=dtype, device=DEVICE)
    with torch.no_grad():
        norm.weight.copy_(rows(1, 96, dtype=dtype, seed=62)[0] + 1)
    gate_up = rows(5, 192, dtype=dtype, seed=63, scale=3.0)

    def same(got: torch.Tensor | Fp8Activation, want: torch.Tensor) -> None:
        assert isinstance(got, Fp8Activation) and got.dtype == dtype
        ref = Fp8Activation.quantize(want)
        assert_same_fp8((got.values, got.scales), (ref.values, ref.scales))

    same(norm(x, quantize=True), norm(x))
    r1, r2 = res.clone(), res.clone()
    got, r1_out = norm(x, r1, quantize=True)
    want, _ = norm(x, r2)
    assert r1_out is r1 and torch.equal(r1, r2)
    same(got, want)
    act = SiluAndMul()
    same(act(gate_up, quantize=True), act(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
def test_layers_quantize_on_the_pytorch_path(dtype: torch.dtype) -> None:
    check_layers(dtype)


@interpreter
@pytest.mark.parametrize("dtype", DTYPES)
def test_layers_quantize_on_the_fused_path(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = route_to_fused(monkeypatch)
    check_layers(dtype)
    assert calls  # the kernels ran (in the interpreter)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("t", [64, 1024])
@pytest.mark.parametrize("width", [4096, 14336])
def test_cuda_fused_equals_unfused(t: int, width: int) -> None:
    """Compiled for the GPU, at Llama-3-8B's widths (hidden 4,096, intermediate 14,336):
    each fused kernel against its 16-bit kernel followed by the quantization kernel."""
    x = rows(t, width, dtype=torch.bfloat16, seed=t)
    w = rows(1, width, dtype=torch.bfloat16, seed=1)[0] / 50 + 1
    assert_same_fp8(rms_norm_fp8(x, w, EPS), per_token_fp8(rms_norm(x, w, EPS)))
    res = rows(t, width, dtype=torch.bfloat16, seed=2, scale=4.0)
    r1, r2 = res.clone(), res.clone()
    got = fused_add_rms_norm_fp8(x, r1, w, EPS)
    assert_same_fp8(got, per_token_fp8(fused_add_rms_norm(x, r2, w, EPS)))
    assert torch.equal(r1, r2)
    gate_up = rows(t, 2 * width, dtype=torch.bfloat16, seed=3, scale=3.0)
    assert_same_fp8(silu_and_mul_fp8(gate_up), per_token_fp8(silu_and_mul(gate_up)))
