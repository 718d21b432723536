"""Activation quantization fused into the kernels that produce an FP8 linear's input.

When `wants_fp8_input` says yes, the norms and SiLU-and-mul hand the linear layer an
`Fp8Activation` that `fp8_linear` feeds straight into `_scaled_mm`; it must change no
bit of the model's outputs. The `_scaled_mm` path needs sm90, so on CPU the tests force
it (`cpu_scaled_mm`: torch's CPU `_scaled_mm`, which torch 2.13 has, with the fused
kernels in triton's interpreter); the gpu tests run it for real.
"""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.layers import kernels
from radixmesh.worker.layers.dense import PackableLinear
from radixmesh.worker.layers.linear import RowParallelLinear
from radixmesh.worker.layers.parallel import TPGroup
from radixmesh.worker.layers.quantization import fp8
from radixmesh.worker.layers.quantization.fp8 import (
    FUSED_QUANT_SWITCH,
    Fp8Activation,
    fp8_linear,
    fp8_linear_scaled_mm,
    fused_quant_applies,
    quantize_rows,
)
from radixmesh.worker.layers.quantization.fp8_scales import quantize
from radixmesh.worker.model.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from tests.worker.model.helpers import RaggedRunner, make_pair, random_ids

MAX_ROWS = 16  # the small-batch kernel's (fp8_small_m.MAX_ROWS; asserted below)
# Rows scaled up in the model overflow exp(-gate) to inf in SiLU (silu -> -0, as on the
# GPU); numpy, under the interpreter, warns about it.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="triton's interpreter on CPU tensors: machines without CUDA"
)


def gaussian(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def cpu_scaled_mm(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Test-only: the fused kernels on CPU tensors (interpreter) and `_scaled_mm` taken
    for bfloat16 on CPU as on an sm90 GPU. Returns a list that grows by one for each
    GEMM fed an `Fp8Activation`."""
    monkeypatch.setattr(kernels, "enabled", lambda t: True)
    monkeypatch.setattr(
        fp8,
        "scaled_mm_applies",
        lambda x, q: x.dtype == torch.bfloat16 and q.shape[0] % 16 == 0 and q.shape[1] % 16 == 0,
    )
    return count_quantized_gemms(monkeypatch)


def count_quantized_gemms(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by each GEMM's rows that is fed an `Fp8Activation`."""
    fed: list[int] = []
    plain = fp8.fp8_activation_scaled_mm

    def counted(
        x: Fp8Activation, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        fed.append(x.shape[0])
        return plain(x, q, scale, bias)

    monkeypatch.setattr(fp8, "fp8_activation_scaled_mm", counted)
    return fed


def test_max_rows_is_the_small_batch_kernels() -> None:
    from radixmesh.worker.layers.kernels.fp8_small_m import MAX_ROWS as KERNEL_MAX_ROWS

    assert KERNEL_MAX_ROWS == MAX_ROWS


def test_quantized_input_gives_the_same_gemm() -> None:
    # torch._scaled_mm with row-wise scales runs on CUDA, and on CPU since torch 2.13 (the
    # GPU machine's older torch has only per-tensor scales there): the calls side by side.
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = gaussian(33, 256, seed=1, dtype=torch.bfloat16).to(dev)
    x[0] *= 1000  # an outlier token
    q, scale = (t.to(dev) for t in quantize_rows(gaussian(320, 256, seed=2)))
    bias = gaussian(320, seed=3, dtype=torch.bfloat16).to(dev)
    xq = Fp8Activation.quantize(x)
    assert xq.shape == x.shape and xq.dtype == torch.bfloat16
    for b in (None, bias):
        want = fp8_linear_scaled_mm(x, q, scale, b)
        got = fp8_linear(xq, q, scale, b)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_quantized_input_needs_channel_scales() -> None:
    q, scale = quantize(gaussian(32, 256, seed=4), "1x128")
    with pytest.raises(ValueError, match="per-channel"):
        fp8_linear(Fp8Activation.quantize(gaussian(20, 256, seed=5)), q, scale, None)


def test_carrier_checks_its_parts() -> None:
    xq = Fp8Activation.quantize(gaussian(4, 32, seed=6))
    with pytest.raises(ValueError, match="scales"):
        Fp8Activation(xq.values, xq.scales[:3], torch.float32)
    with pytest.raises(ValueError, match="values"):
        Fp8Activation(xq.values.float(), xq.scales, torch.float32)
    torch.testing.assert_close(xq.dequantize(), gaussian(4, 32, seed=6), rtol=0.07, atol=0)


def fp8_row_layer(tp: TPGroup | None = None) -> RowParallelLinear:
    """A loaded FP8 layer taking 64 input columns on this rank."""
    size = 1 if tp is None else tp.size
    layer = RowParallelLinear(64 * size, 32, dtype=torch.bfloat16, tp=tp)
    fp8.method_for("fp8").create_weights(layer)
    q, scale = quantize_rows(gaussian(32, 64 * size, seed=7))
    layer.weight.data.copy_(q[:, :64])
    layer.weight_scale.data.copy_(scale)
    return layer


def test_who_gets_a_quantized_input(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = fp8_row_layer()
    many = gaussian(MAX_ROWS + 1, 64, seed=8, dtype=torch.bfloat16)
    few = many[:MAX_ROWS]
    assert not layer.wants_fp8_input(many)  # CPU: no `_scaled_mm` path
    cpu_scaled_mm(monkeypatch)
    monkeypatch.delenv(FUSED_QUANT_SWITCH, raising=False)
    assert layer.wants_fp8_input(many)  # on by default
    monkeypatch.setenv(FUSED_QUANT_SWITCH, "1")
    assert layer.wants_fp8_input(many)
    assert not layer.wants_fp8_input(few)  # the small-batch kernel's rows
    assert not layer.wants_fp8_input(many.float())  # _scaled_mm's row-wise mode: bf16
    assert not fused_quant_applies(many, layer.weight, layer.weight_scale[:, None])  # groups
    layer.batch_invariant = True  # deterministic mode
    assert not layer.wants_fp8_input(many)
    layer.batch_invariant = False
    assert not fp8_row_layer(tp=TPGroup(rank=0, size=2)).wants_fp8_input(many)
    plain = RowParallelLinear(64, 32, dtype=torch.bfloat16)
    assert not plain.wants_fp8_input(many)  # unquantized
    monkeypatch.setenv(FUSED_QUANT_SWITCH, "0")
    assert not layer.wants_fp8_input(many)


def test_unquantized_layer_refuses_a_quantized_input() -> None:
    plain: PackableLinear = RowParallelLinear(64, 32)
    with pytest.raises(AssertionError):
        plain(Fp8Activation.quantize(gaussian(3, 64, seed=9)))


def fp8_model(device: str = "cpu") -> LlamaForCausalLM:
    hf, ours = make_pair("llama")
    model = LlamaForCausalLM(ours.arch, dtype=torch.bfloat16, device=device, quantization="fp8")
    model.load_weights(hf.state_dict().items())
    return model


def logits_of(model: LlamaForCausalLM, prompts: list[int]) -> torch.Tensor:
    """Logits of a mixed extend step (one prompt per length given) and a decode step."""
    runner = RaggedRunner(model, max_requests=max(8, len(prompts)))
    steps = [
        [(i, random_ids(n, seed=i + 1)) for i, n in enumerate(prompts)],
        [(i, [3 + i]) for i in range(len(prompts))],
    ]
    return torch.cat([torch.cat(runner.step(items)) for items in steps])  # [T, vocab]


@interpreter
def test_model_logits_are_unchanged_by_the_fusion(monkeypatch: pytest.MonkeyPatch) -> None:
    """dummy-sized Llama, FP8 weights, bf16: a 29-row extend step takes the fused path
    (2 layers x 3 quantized inputs), the 2-row decode step the plain one; both steps'
    logits equal those with the fusion switched off, bit for bit."""
    model = fp8_model()
    fed = cpu_scaled_mm(monkeypatch)
    monkeypatch.setenv(FUSED_QUANT_SWITCH, "0")
    want = logits_of(model, [20, 9])
    assert fed == []
    monkeypatch.setenv(FUSED_QUANT_SWITCH, "1")
    got = logits_of(model, [20, 9])
    assert fed == [29] * 6
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# 64 and 1,020 rows (the test model has 256 positions: a 255-token prompt and one more)
@pytest.mark.parametrize("prompts", [[40, 24], [255, 255, 255, 255]])
def test_cuda_model_logits_are_unchanged_by_the_fusion(
    prompts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fp8_model("cuda")
    decoder = model.model.layers[0]
    assert isinstance(decoder, LlamaDecoderLayer) and isinstance(decoder.mlp, LlamaMLP)
    layer = decoder.mlp.down_proj
    probe = torch.zeros(sum(prompts), 128, dtype=torch.bfloat16, device="cuda")
    monkeypatch.setenv(FUSED_QUANT_SWITCH, "1")
    assert layer.wants_fp8_input(probe), torch.cuda.get_device_capability()
    fed = count_quantized_gemms(monkeypatch)
    monkeypatch.setenv(FUSED_QUANT_SWITCH, "0")
    want = logits_of(model, prompts)
    assert fed == []
    monkeypatch.setenv(FUSED_QUANT_SWITCH, "1")
    got = logits_of(model, prompts)
    assert fed == [sum(prompts)] * 6
    assert torch.equal(got, want)
