"""FP8 layers with a checkpoint's static input scale: quantizing with it, a fused layer's
scale as the largest of its pieces' on every tensor-parallel rank, the CPU path against a
plain-PyTorch reference, `_scaled_mm`'s tensor-wise and row-wise forms against it, and
the fused per-token quantization left out."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers.dense import PackableLinear
from radixmesh.worker.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from radixmesh.worker.layers.parallel import TPGroup
from radixmesh.worker.layers.quantization import dequantize_linears, linear_method
from radixmesh.worker.layers.quantization.fp8 import (
    FP8,
    FP8_MAX,
    Fp8Activation,
    fp8_linear,
    scaled_mm_applies,
)
from radixmesh.worker.layers.quantization.fp8_static import (
    Fp8StaticLinearMethod,
    check_input_scale,
    quantize_static,
    static_scaled_mm,
)
from radixmesh.worker.layers.weights import ShardId, get_weight_loader, is_optional

HIDDEN, HEAD_DIM, HEADS, KV_HEADS = 32, 16, 4, 2
QKV_ROWS = {"q": HEADS * HEAD_DIM, "k": KV_HEADS * HEAD_DIM, "v": KV_HEADS * HEAD_DIM}
# A bfloat16 result of `_scaled_mm` against the same operands multiplied in float32: at
# most half a bfloat16 step (2^-9 of the value) from rounding the product, half a step of
# the sum from adding the bias in bfloat16, and SUM_ATOL of the product's largest value
# for sums kept with fewer bits than float32 (the CPU's `_scaled_mm` measured 2.1e-3;
# Hopper's FP8 tensor cores accumulate with fewer bits between promotions to float32). A
# wrong or missing scale is off by the size of the values themselves.
HALF_BF16_STEP = 2.0**-9
SUM_ATOL = 4e-3


def gaussian(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def load(param: nn.Parameter, full: torch.Tensor, shard_id: ShardId = None) -> None:
    get_weight_loader(param)(param, full, shard_id)


def static_layer(layer: PackableLinear) -> PackableLinear:
    linear_method("fp8-static").create_weights(layer)
    return layer


def scale_param(layer: PackableLinear) -> nn.Parameter:
    """The layer's input_scale parameter, before `check_loaded`."""
    param = layer.input_scale
    assert isinstance(param, nn.Parameter)
    return param


def input_scale(layer: PackableLinear) -> torch.Tensor | None:
    scale: torch.Tensor | None = getattr(layer, "input_scale", None)
    return scale


def reference(
    x: torch.Tensor, s: torch.Tensor, q: torch.Tensor, ws: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Plain PyTorch: x quantized with s and dequantized, times the dequantized weight, all
    in float32."""
    x_deq = (x.float() / s).clamp(-448, 448).to(FP8).float() * s
    return F.linear(x_deq, q.float() * ws[:, None], None if bias is None else bias.float())


def qkv_checkpoint() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """q, k, v in FP8 with per-tensor weight scales, and their (different) input scales."""
    weight_scales = {"q": 0.01, "k": 0.02, "v": 0.015}
    weights = {
        n: (gaussian(rows, HIDDEN, seed=i) * 0.1 / weight_scales[n]).to(FP8)
        for i, (n, rows) in enumerate(QKV_ROWS.items())
    }
    scales = {n: torch.tensor(weight_scales[n]) for n in QKV_ROWS}
    return weights, scales


def loaded_qkv(tp: TPGroup | None = None, inputs: dict[str, float] | None = None) -> PackableLinear:
    inputs = inputs if inputs is not None else {"q": 0.03, "k": 0.05, "v": 0.04}
    weights, scales = qkv_checkpoint()
    layer = static_layer(QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, tp=tp))
    for name in "qkv":
        load(layer.weight, weights[name], name)
        load(layer.weight_scale, scales[name], name)
        if name in inputs:
            load(scale_param(layer), torch.tensor(inputs[name]), name)
    assert layer.linear_method is not None
    layer.linear_method.check_loaded(layer)
    return layer


def test_quantize_divides_clamps_and_rounds_to_e4m3() -> None:
    s = torch.tensor(0.5)
    x = torch.tensor([[0.0, 1.0, -3.3, 224.0, 1000.0, -1e9]])
    # 1/0.5 = 2 and 448 exact; -6.6 rounds to e4m3's -6.5; beyond 448 saturates.
    assert quantize_static(x, s).float().tolist() == [[0.0, 2.0, -6.5, 448.0, 448.0, -448.0]]
    bf16 = x.to(torch.bfloat16)
    assert torch.equal(
        quantize_static(bf16, s).view(torch.uint8),
        quantize_static(bf16.float(), s).view(torch.uint8),
    )


@pytest.mark.parametrize("size", [1, 2])
def test_fused_qkv_takes_the_largest_input_scale_on_every_rank(size: int) -> None:
    for rank in range(size):
        layer = loaded_qkv(TPGroup(rank, size))
        s = input_scale(layer)
        assert s is not None and s.shape == ()
        assert s.item() == torch.tensor(0.05).item()  # k's
        assert is_optional(scale_param(layer))


def test_gate_up_and_row_layers_take_their_own_scale() -> None:
    mlp = static_layer(MergedColumnParallelLinear(HIDDEN, [24, 24]))
    for shard, s in ((0, 0.25), (1, 0.125)):
        load(mlp.weight, gaussian(24, HIDDEN, seed=shard).to(FP8), shard)
        load(mlp.weight_scale, torch.tensor([0.5]), shard)
        load(scale_param(mlp), torch.tensor([s]), shard)  # [1], as some tools write it
    down = static_layer(RowParallelLinear(48, HIDDEN, tp=TPGroup(1, 2)))
    load(down.weight, gaussian(HIDDEN, 48, seed=3).to(FP8))
    load(down.weight_scale, torch.tensor(0.5))
    load(scale_param(down), torch.tensor(0.75))
    for layer in (mlp, down):
        assert layer.linear_method is not None
        layer.linear_method.check_loaded(layer)
    assert [float(scale_param(mlp)), float(scale_param(down))] == [0.25, 0.75]
    # Equal weight scales: one value for the whole layer, the tensor-wise GEMM.
    assert mlp.weight_scale_is_scalar and down.weight_scale_is_scalar


def test_cpu_forward_equals_the_plain_reference_exactly() -> None:
    layer = loaded_qkv()
    assert not layer.weight_scale_is_scalar  # q, k, v scales differ: per channel
    x = gaussian(9, HIDDEN, seed=20) * 3
    x[0, 0] = 40.0  # past 448 * 0.05 = 22.4: saturates
    s = input_scale(layer)
    assert s is not None
    out = layer(x)
    torch.testing.assert_close(
        out, reference(x, s, layer.weight, layer.weight_scale, None), rtol=0, atol=0
    )
    # The static scale is used: per-token scales (here: none on CPU) give other numbers.
    assert not torch.equal(out, fp8_linear(x, layer.weight, layer.weight_scale, None))


def test_a_layer_without_an_input_scale_keeps_per_token_quantization() -> None:
    layer = loaded_qkv(inputs={})  # stored in full precision by the checkpoint, say
    assert input_scale(layer) is None
    x = gaussian(5, HIDDEN, seed=21)
    torch.testing.assert_close(
        layer(x), fp8_linear(x, layer.weight, layer.weight_scale, None), rtol=0, atol=0
    )


def test_static_layers_never_ask_for_a_fused_quantized_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Where fp8.py's fused quantization would say yes (CUDA, many rows, the switch on),
    # only the layer without a static scale passes the question on.
    def always(self: object, layer: object, x: torch.Tensor) -> bool:
        return True

    monkeypatch.setattr(
        "radixmesh.worker.layers.quantization.fp8.Fp8LinearMethod.wants_fp8_input", always
    )
    x = gaussian(64, HIDDEN, seed=22)
    assert not loaded_qkv().wants_fp8_input(x)
    assert loaded_qkv(inputs={}).wants_fp8_input(x)
    with pytest.raises(ValueError, match="static input scale"):
        loaded_qkv()(Fp8Activation.quantize(x))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (torch.tensor(0.0), "above 0, got 0.0"),
        (torch.tensor(-0.5), "above 0, got -0.5"),
        (torch.tensor(float("nan")), "got nan"),
        (torch.tensor(float("inf")), "got inf"),
        (torch.tensor(1e-50, dtype=torch.float64), "got 0.0"),  # zero in float32
        (torch.tensor([0.1, 0.2]), r"one value, got shape \(2,\)"),
    ],
)
def test_bad_input_scales_are_rejected(value: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_input_scale(value)
    layer = static_layer(RowParallelLinear(HIDDEN, 16))
    with pytest.raises(ValueError, match=message):
        load(scale_param(layer), value)


def test_cpu_dequantize_once_drops_the_input_scale() -> None:
    model = nn.Sequential(loaded_qkv())
    assert dequantize_linears(model, torch.float32) == 1
    names = [n for n, _ in model.named_parameters()]
    assert names == ["0.weight"]


@pytest.mark.parametrize("tensorwise", [True, False], ids=["tensorwise", "rowwise"])
def test_scaled_mm_forms_against_the_reference(tensorwise: bool) -> None:
    # torch._scaled_mm also runs on CPU (torch 2.13); fp8_static_linear calls it on CUDA.
    version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    if not tensorwise and version < (2, 13):  # the project pins 2.13: not in `make test`
        pytest.skip("before torch 2.13 the CPU _scaled_mm is per-tensor only (CUDA: below)")
    check_scaled_mm("cpu", 33, 320, 256, tensorwise)


def check_scaled_mm(device: str, tokens: int, n: int, k: int, tensorwise: bool) -> None:
    x = (gaussian(tokens, k, seed=30) * 2).to(device=device, dtype=torch.bfloat16)
    s = torch.tensor(2.0 / FP8_MAX * 3, device=device)  # 3 sigma: a few values saturate
    w = gaussian(n, k, seed=31).to(device)
    ws = (
        torch.full((n,), 0.004, device=device)
        if tensorwise
        else torch.linspace(0.002, 0.006, n, device=device)
    )
    q = (w * 16).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    bias = gaussian(n, seed=32, dtype=torch.bfloat16).to(device)
    out = static_scaled_mm(x, s, q, ws, bias, tensorwise=tensorwise)
    assert out.dtype == torch.bfloat16 and out.shape == (tokens, n)
    assert_within_bf16_rounding(out, reference(x, s, q, ws, None), bias)


def assert_within_bf16_rounding(
    out: torch.Tensor, product: torch.Tensor, bias: torch.Tensor | None
) -> None:
    ref = product if bias is None else product + bias.float()
    bound = HALF_BF16_STEP * (product.abs() + ref.abs()) + SUM_ATOL * product.abs().max()
    err = (out.float() - ref).abs()
    assert bool((err <= bound).all()), float((err - bound).max())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tensorwise", [True, False], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize(
    ("tokens", "n", "k"), [(1, 4096, 4096), (37, 6144, 4096), (256, 4096, 14336)]
)
def test_cuda_static_gemm_against_the_reference(
    tokens: int, n: int, k: int, tensorwise: bool
) -> None:
    """Llama-3-8B's shapes through `_scaled_mm` with a static input scale, and the layer
    on CUDA taking that path."""
    check_scaled_mm("cuda", tokens, n, k, tensorwise)
    x = gaussian(tokens, k, seed=33, dtype=torch.bfloat16).cuda()
    q = gaussian(n, k, seed=34).cuda().to(FP8)
    assert scaled_mm_applies(x, q), torch.cuda.get_device_capability()
    layer = static_layer(RowParallelLinear(k, n, dtype=torch.bfloat16, device="cuda"))
    load(layer.weight, q)
    load(layer.weight_scale, torch.tensor(0.01) if tensorwise else torch.linspace(0.005, 0.02, n))
    load(scale_param(layer), torch.tensor(4.0 / FP8_MAX))
    method = layer.linear_method
    assert isinstance(method, Fp8StaticLinearMethod)
    method.check_loaded(layer)
    assert layer.weight_scale_is_scalar == tensorwise
    s = input_scale(layer)
    assert s is not None
    out = layer(x)
    assert_within_bf16_rounding(out, reference(x, s, layer.weight, layer.weight_scale, None), None)
