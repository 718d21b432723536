"""The fused Triton kernels (`layers/kernels/`) against the PyTorch ops they replace.

On CPU they run in triton's interpreter (see conftest.py). Exact where the kernel's math
is PyTorch's op for op (the residual add, rotary in both dtypes); where a reduction or
exp is evaluated in another order or by another implementation (the norm's mean of
squares, SiLU's exp), within 1e-6 relative in float32 and one ulp in bfloat16.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixmesh.worker.layers import kernels
from radixmesh.worker.layers.activation import SiluAndMul
from radixmesh.worker.layers.kernels.rms_norm import fused_add_rms_norm, rms_norm
from radixmesh.worker.layers.kernels.rotary import norm_rotary_ as norm_rotary_kernel
from radixmesh.worker.layers.kernels.rotary import rotary_
from radixmesh.worker.layers.kernels.silu_mul import silu_and_mul
from radixmesh.worker.layers.norm import RMSNorm
from radixmesh.worker.layers.rotary import RotaryEmbedding, apply_rotary, apply_rotary_
from radixmesh.worker.layers.rotary import norm_rotary_ as norm_rotary
from radixmesh.worker.model.llama import LlamaForCausalLM
from tests.worker.model.helpers import RaggedRunner, make_pair, random_ids

DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-5
# The tests on CPU tensors run the kernels in triton's interpreter (conftest.py), which is
# set only where there is no GPU; on a CUDA machine the gpu tests at the end run them
# compiled against PyTorch's CUDA ops instead.
interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="triton's interpreter on CPU tensors: machines without CUDA"
)


def assert_close(
    got: torch.Tensor, want: torch.Tensor, *, rtol: float = 1e-6, ulps: int = 1
) -> None:
    """float32: within `rtol` relative; bfloat16: at most `ulps` ulps apart."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=rtol, atol=1e-7)
    else:
        apart = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
        assert int(apart.max()) <= ulps, (got, want)


def randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=gen)).to(dtype)


@interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "hidden"), [(1, 64), (3, 96), (17, 4000)])
def test_rms_norm(dtype: torch.dtype, t: int, hidden: int) -> None:
    x, w = randn(t, hidden, dtype=dtype, seed=0), randn(hidden, dtype=dtype, seed=1) + 1
    assert_close(rms_norm(x, w, EPS), F.rms_norm(x, (hidden,), w, EPS))


@interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "hidden"), [(1, 64), (3, 96), (17, 4000)])
def test_fused_add_rms_norm(dtype: torch.dtype, t: int, hidden: int) -> None:
    x, w = randn(t, hidden, dtype=dtype, seed=0), randn(hidden, dtype=dtype, seed=1) + 1
    # The residual is a strided view (rows of a wider buffer) updated in place.
    buf = randn(t, hidden + 8, dtype=dtype, seed=2, scale=4.0)
    residual, before = buf[:, :hidden], buf.clone()
    x_before = x.clone()
    out = fused_add_rms_norm(x, residual, w, EPS)
    summed = before[:, :hidden] + x
    assert torch.equal(residual, summed)  # rounded to the dtype as PyTorch's add rounds
    assert torch.equal(buf[:, hidden:], before[:, hidden:])  # nothing outside the rows
    assert torch.equal(x, x_before)  # the normed rows go to a new tensor
    assert_close(out, F.rms_norm(summed, (hidden,), w, EPS))


@interpreter
def test_rms_norm_rows_with_a_stride() -> None:
    buf = randn(5, 100, dtype=torch.float32, seed=3)
    x, w = buf[:, 2:98], randn(96, dtype=torch.float32, seed=4)
    assert_close(rms_norm(x, w, EPS), F.rms_norm(x, (96,), w, EPS))


@interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "h", "hkv", "d"), [(1, 4, 2, 64), (3, 2, 1, 96), (17, 3, 3, 32)])
def test_rotary_in_place_in_fused_qkv(dtype: torch.dtype, t: int, h: int, hkv: int, d: int) -> None:
    rope = RotaryEmbedding(d, rope_theta=10000.0, max_position=4096, dtype=dtype)
    positions = torch.randint(0, 4096, (t,), generator=torch.Generator().manual_seed(t))
    cos, sin = rope(positions)
    qkv = randn(t, (h + 2 * hkv) * d, dtype=dtype, seed=5, scale=3.0)
    before = qkv.clone()
    qk = qkv[:, : (h + hkv) * d].view(t, h + hkv, d)  # row stride (h + 2 hkv) * d
    want = apply_rotary(qk, cos, sin)
    rotary_(qk, cos, sin)
    assert torch.equal(qk, want)
    assert torch.equal(qkv[:, (h + hkv) * d :], before[:, (h + hkv) * d :])  # v untouched


@interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "h", "hkv", "d"), [(1, 4, 2, 64), (3, 16, 4, 128), (5, 2, 2, 32)])
def test_qwen3_norm_then_rotary_in_place_in_fused_qkv(
    dtype: torch.dtype, t: int, h: int, hkv: int, d: int
) -> None:
    """The per-head q and k norms, then rotary, in one kernel against the norms' and
    rotary's PyTorch ops: the norm's sum of squares adds in another order, so float32
    agrees within 1e-5 and bfloat16 within its rounding (an ulp of the normed value can
    move the rotated one by a few)."""
    rope = RotaryEmbedding(d, rope_theta=1000000.0, max_position=4096, dtype=dtype)
    cos, sin = rope(torch.randint(0, 4096, (t,), generator=torch.Generator().manual_seed(t)))
    q_norm, k_norm = RMSNorm(d, 1e-6, dtype=dtype), RMSNorm(d, 1e-6, dtype=dtype)
    q_norm.weight.data.copy_(randn(d, dtype=dtype, seed=8) + 1)
    k_norm.weight.data.copy_(randn(d, dtype=dtype, seed=9) + 1)
    qkv = randn(t, (h + 2 * hkv) * d, dtype=dtype, seed=10, scale=3.0)
    before = qkv.clone()
    qk = qkv[:, : (h + hkv) * d].view(t, h + hkv, d)  # row stride (h + 2 hkv) * d
    want = norm_rotary(qk, h, q_norm, k_norm, cos, sin)  # the PyTorch path on CPU
    norm_rotary_kernel(qk, h, q_norm.weight, k_norm.weight, 1e-6, cos, sin)
    if dtype == torch.float32:
        torch.testing.assert_close(qk, want, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(qk.float(), want.float(), rtol=0.02, atol=0.02)
    assert torch.equal(qkv[:, (h + hkv) * d :], before[:, (h + hkv) * d :])  # v untouched


@interpreter
def test_rotary_splits_heads_over_programs() -> None:
    # Llama-3-8B decode shape: 32 + 8 heads of 128 dims, three programs of 16 heads per
    # token (the last one partly masked).
    rope = RotaryEmbedding(128, rope_theta=500000.0, max_position=8192, dtype=torch.bfloat16)
    cos, sin = rope(torch.tensor([8191, 0]))
    qkv = randn(2, 48 * 128, dtype=torch.bfloat16, seed=6)
    qk = qkv[:, : 40 * 128].view(2, 40, 128)
    want = apply_rotary(qk, cos, sin)
    rotary_(qk, cos, sin)
    assert torch.equal(qk, want)


@interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "d"), [(1, 64), (3, 96), (17, 1500)])
def test_silu_and_mul(dtype: torch.dtype, t: int, d: int) -> None:
    gate_up = randn(t, 2 * d, dtype=dtype, seed=7, scale=3.0)
    want = F.silu(gate_up[:, :d]) * gate_up[:, d:]
    assert_close(silu_and_mul(gate_up), want)


def test_empty_batch() -> None:
    w = torch.ones(64)
    assert rms_norm(torch.empty(0, 64), w, EPS).shape == (0, 64)
    assert fused_add_rms_norm(torch.empty(0, 64), torch.empty(0, 64), w, EPS).shape == (0, 64)
    assert silu_and_mul(torch.empty(0, 128)).shape == (0, 64)
    cos = torch.empty(0, 1, 32)
    rotary_(torch.empty(0, 2, 32), cos, cos)


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not kernels.enabled(torch.zeros(1))  # CPU: the PyTorch ops
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    assert not kernels.enabled(torch.zeros(1))


def route_to_fused(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Send the layers' CPU tensors to the fused kernels (interpreter); records each call."""
    calls: list[torch.Tensor] = []

    def enabled(t: torch.Tensor) -> bool:
        calls.append(t)
        return True

    monkeypatch.setattr(kernels, "enabled", enabled)
    return calls


@interpreter
@pytest.mark.parametrize("dtype", DTYPES)
def test_layers_on_the_fused_path_match_pytorch(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, residual = randn(3, 96, dtype=dtype, seed=8), randn(3, 96, dtype=dtype, seed=9)
    norm = RMSNorm(96, EPS, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(randn(96, dtype=dtype, seed=10) + 1)
    rope = RotaryEmbedding(32, rope_theta=10000.0, max_position=64, dtype=dtype)
    cos, sin = rope(torch.tensor([0, 7, 63]))
    qk, gate_up = randn(3, 3, 32, dtype=dtype, seed=11), randn(3, 192, dtype=dtype, seed=12)

    def run() -> list[torch.Tensor]:
        stream = residual.clone()
        normed_sum, new_residual = norm(x, stream)
        assert new_residual is stream  # updated in place on either path
        rotated = apply_rotary_(qk.clone(), cos, sin)
        return [norm(x), normed_sum, new_residual, rotated, SiluAndMul()(gate_up)]

    want = run()
    calls = route_to_fused(monkeypatch)
    got = run()
    assert len(calls) == 4
    for g, w in zip(got, want, strict=True):
        assert_close(g, w)
    assert torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])  # sum, rotary


def model_outputs(model: LlamaForCausalLM) -> torch.Tensor:
    """Final hidden states of a mixed extend step (two prompts) and a decode step."""
    runner = RaggedRunner(model)
    steps = [[(0, random_ids(13, seed=1)), (1, random_ids(5, seed=2))], [(0, [3]), (1, [4])]]
    outs = []
    with torch.inference_mode():
        for items in steps:
            batch = runner.make_batch(items)
            runner.attn.prepare(batch)
            outs.append(model(batch, runner.attn))
    return torch.cat(outs)  # [T, hidden]


@interpreter
@pytest.mark.parametrize("dtype", DTYPES)
def test_model_on_the_fused_path_matches_pytorch(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf, ours = make_pair("llama")
    model = LlamaForCausalLM(ours.arch, dtype=dtype)
    model.load_weights(hf.state_dict().items())
    want = model_outputs(model)
    calls = route_to_fused(monkeypatch)
    got = model_outputs(model)
    assert len(calls) == 2 * (2 * 4 + 1)  # 2 steps x (2 layers x (2 norms, rotary, act) + norm)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # |hidden| up to ~4
    else:
        # The float32-level differences (the norm's sum order, SiLU's exp) vanish in the
        # bfloat16 roundings here; every other step is PyTorch's, rounding for rounding.
        assert torch.equal(got, want)


def cuda_pair(dtype: torch.dtype) -> LlamaForCausalLM:
    hf, ours = make_pair("llama")
    model = LlamaForCausalLM(ours.arch, dtype=dtype, device="cuda")
    model.load_weights(hf.state_dict().items())
    return model


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 0.1)])
def test_cuda_fused_path_matches_pytorch_path(
    dtype: torch.dtype, atol: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = cuda_pair(dtype)
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    want = model_outputs(model)
    monkeypatch.setenv(kernels.ENV_SWITCH, "1")
    assert kernels.enabled(want)
    got = model_outputs(model)
    # bfloat16: F.rms_norm's CUDA kernel may round a value the other way; a flip in one
    # layer moves the final hidden states (|h| up to ~4, ulp 1/32 there) by a few ulps.
    torch.testing.assert_close(got, want, rtol=0, atol=atol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_kernels_round_as_pytorch(dtype: torch.dtype) -> None:
    """Rotary and the residual add, compiled for the GPU (no mul-add fusion, rounding to
    nearest even), equal PyTorch's CUDA ops bit for bit."""
    rope = RotaryEmbedding(128, rope_theta=500000.0, max_position=8192, dtype=dtype, device="cuda")
    cos, sin = rope(torch.tensor([0, 1, 4095, 8191], device="cuda"))
    qkv = randn(4, 48 * 128, dtype=dtype, seed=13, scale=3.0).cuda()
    qk = qkv[:, : 40 * 128].view(4, 40, 128)
    want = apply_rotary(qk, cos, sin)
    rotary_(qk, cos, sin)
    assert torch.equal(qk, want)
    x, residual = randn(4, 4096, dtype=dtype, seed=14).cuda(), randn(4, 4096, dtype=dtype, seed=15)
    residual = residual.cuda()
    w = randn(4096, dtype=dtype, seed=16).cuda() + 1
    summed = residual + x
    out = fused_add_rms_norm(x, residual, w, EPS)
    assert torch.equal(residual, summed)
    assert_close(out.cpu(), F.rms_norm(summed, (4096,), w, EPS).cpu())
    # SiLU: the GPU's fast exp is a few float32 ulps off PyTorch's expf at large |gate|;
    # in bfloat16 a silu that rounds the other way moves the product by up to ~2 ulps.
    gate_up = randn(4, 2 * 14336, dtype=dtype, seed=17, scale=3.0).cuda()
    want_act = F.silu(gate_up[:, :14336]) * gate_up[:, 14336:]
    assert_close(silu_and_mul(gate_up).cpu(), want_act.cpu(), rtol=2e-6, ulps=3)
