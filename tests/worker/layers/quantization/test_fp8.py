"""FP8 linear layers: per-channel quantization, the dequantize reference and the
`_scaled_mm` path against float32, sharding under tensor parallelism, FP8 checkpoints'
scales, and the CPU's dequantize-once path (group scales: test_fp8_groups.py)."""

from __future__ import annotations

from typing import TypeVar

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
from radixmesh.worker.layers.quantization import (
    dequantize_linears,
    linear_method,
    quantization_methods,
)
from radixmesh.worker.layers.quantization.fp8 import (
    FP8,
    FP8_MAX,
    dequantize_rows,
    fp8_linear,
    fp8_linear_ref,
    fp8_linear_scaled_mm,
    quantize_rows,
    scaled_mm_applies,
)
from radixmesh.worker.layers.weights import ShardId, get_weight_loader, is_optional

# Relative (Frobenius) error of an FP8 linear against float32 on Gaussian data: e4m3 keeps
# 3 mantissa bits, so each weight is off by at most 2^-4 of itself (~2.3% rms here);
# quantizing the activations per token too (_scaled_mm) adds about as much again.
WEIGHT_ONLY_BOUND = 0.03
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WEIGHT_AND_ACTIVATION_BOUND = 0.045


def gaussian(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


L = TypeVar("L", bound=PackableLinear)


def fp8_layer(layer: L, name: str = "fp8-channel") -> L:
    linear_method(name).create_weights(layer)
    return layer


def load(param: nn.Parameter, full: torch.Tensor, shard_id: ShardId = None) -> None:
    get_weight_loader(param)(param, full, shard_id)


def test_registry_names_fp8() -> None:
    assert quantization_methods() == [
        "fp8",
        "fp8-128x128",
        "fp8-1x128",
        "fp8-channel",
        "fp8-static",
    ]
    assert linear_method("fp8").layout == "channel"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="quantization"):
        linear_method("int3")


def test_rows_use_the_whole_range_and_stay_within_half_a_step() -> None:
    w = gaussian(64, 96, seed=0) * torch.logspace(-3, 2, 64)[:, None]  # rows of any size
    q, scale = quantize_rows(w)
    assert q.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (64,)
    torch.testing.assert_close(scale, w.abs().amax(-1) / FP8_MAX, rtol=0, atol=0)
    assert torch.equal(q.float().abs().amax(-1), torch.full((64,), FP8_MAX))
    back = dequantize_rows(q, scale, torch.float32)
    # |error| <= 2^-4 |w| in e4m3's normal range; below it, half the subnormal step 2^-9.
    bound = torch.maximum(w.abs() * 2.0**-4, scale[:, None] * 2.0**-10)
    assert bool(((back - w).abs() <= bound * (1 + 1e-6)).all())


def test_dequantize_reference_against_float32() -> None:
    x, w, b = gaussian(33, 256, seed=1), gaussian(320, 256, seed=2), gaussian(320, seed=3)
    q, scale = quantize_rows(w)
    out = fp8_linear_ref(x, q, scale, b)
    assert out.dtype == torch.float32 and out.shape == (33, 320)
    assert rel_err(out, F.linear(x, w, b)) < WEIGHT_ONLY_BOUND


def test_scaled_mm_path_against_float32() -> None:
    # The CUDA path's call; torch._scaled_mm also runs on CPU (torch 2.13), so CI checks it.
    x = gaussian(33, 256, seed=4, dtype=torch.bfloat16).to(DEVICE)
    w = gaussian(320, 256, seed=5).to(DEVICE)
    b = gaussian(320, seed=6, dtype=torch.bfloat16).to(DEVICE)
    q, scale = quantize_rows(w)
    out = fp8_linear_scaled_mm(x, q, scale, b)
    assert out.dtype == torch.bfloat16 and out.shape == (33, 320)
    # Exactly the dequantized operands multiplied (up to bfloat16 rounding of the result)...
    xq, x_scale = quantize_rows(x)
    x_deq = dequantize_rows(xq, x_scale, torch.float32)
    dequantized = F.linear(x_deq, dequantize_rows(q, scale, torch.float32), b.float())
    assert rel_err(out, dequantized) < 4e-3
    # ...and close to the float32 product.
    assert rel_err(out, F.linear(x.float(), w, b.float())) < WEIGHT_AND_ACTIVATION_BOUND


def test_scaled_mm_applies_only_on_cuda() -> None:
    q, _ = quantize_rows(gaussian(32, 32, seed=7))
    assert not scaled_mm_applies(gaussian(4, 32, seed=8, dtype=torch.bfloat16), q)


@pytest.mark.parametrize("size", [1, 2])
def test_qkv_from_fp8_checkpoint_keeps_values_and_per_tensor_scales(size: int) -> None:
    # q, k, v stored in FP8 with one scale each (the usual FP8 checkpoint): fused into one
    # weight, every row keeps its tensor's scale and the values their bits.
    hidden, d, heads, kv_heads = 32, 16, 4, 2
    parts = {
        "q": gaussian(heads * d, hidden, seed=10),
        "k": gaussian(kv_heads * d, hidden, seed=11),
        "v": gaussian(kv_heads * d, hidden, seed=12),
    }
    scales = {"q": torch.tensor(0.5), "k": torch.tensor([0.25]), "v": torch.tensor(2.0)}
    stored = {n: (t / scales[n]).to(FP8) for n, t in parts.items()}
    for rank in range(size):
        layer = fp8_layer(QKVParallelLinear(hidden, d, heads, kv_heads, tp=TPGroup(rank, size)))
        for name in "qkv":
            load(layer.weight, stored[name], name)
            load(layer.weight_scale, scales[name], name)
        linear_method("fp8").check_loaded(layer)
        q_rows, kv_rows = heads * d // size, kv_heads * d // size
        expect_w = torch.cat([stored[n][rank * r : (rank + 1) * r] for n, r in
                              (("q", q_rows), ("k", kv_rows), ("v", kv_rows))])  # fmt: skip
        assert torch.equal(layer.weight.view(torch.uint8), expect_w.view(torch.uint8))
        expect_s = [0.5] * q_rows + [0.25] * kv_rows + [2.0] * kv_rows
        assert layer.weight_scale.tolist() == expect_s


@pytest.mark.parametrize("size", [2, 3])
def test_sharded_layers_hold_exactly_the_single_rank_rows(size: int) -> None:
    gate, up = gaussian(12, 18, seed=20), gaussian(12, 18, seed=21)
    down = gaussian(18, 12 * size, seed=22)
    one_mlp = fp8_layer(MergedColumnParallelLinear(18, [12, 12]))
    load(one_mlp.weight, gate, 0)
    load(one_mlp.weight, up, 1)
    one_down = fp8_layer(RowParallelLinear(12 * size, 18))
    load(one_down.weight, down)
    for rank in range(size):
        tp = TPGroup(rank, size)
        mlp = fp8_layer(MergedColumnParallelLinear(18, [12, 12], tp=tp))
        load(mlp.weight, gate, 0)
        load(mlp.weight, up, 1)
        rows = torch.cat(
            [torch.arange(rank * 12 // size, (rank + 1) * 12 // size) + o for o in (0, 12)]
        )
        assert torch.equal(mlp.weight.view(torch.uint8), one_mlp.weight[rows].view(torch.uint8))
        assert torch.equal(mlp.weight_scale, one_mlp.weight_scale[rows])
        row = fp8_layer(RowParallelLinear(12 * size, 18, tp=tp))
        load(row.weight, down)
        # A row's scale is the full row's: every rank's slice is the single rank's slice.
        cols = slice(rank * 12, (rank + 1) * 12)
        assert torch.equal(row.weight.view(torch.uint8), one_down.weight[:, cols].view(torch.uint8))
        assert torch.equal(row.weight_scale, one_down.weight_scale)


def test_a_weight_without_its_scale_is_reported() -> None:
    layer = fp8_layer(RowParallelLinear(32, 16))
    assert is_optional(layer.weight_scale)  # not needed from a full-precision checkpoint
    load(layer.weight, gaussian(16, 32, seed=30).to(FP8))  # FP8 values, no scale given
    with pytest.raises(ValueError, match="weight_scale"):
        linear_method("fp8").check_loaded(layer)


def test_other_float8_formats_are_rejected() -> None:
    layer = fp8_layer(RowParallelLinear(32, 16))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        load(layer.weight, gaussian(16, 32, seed=31).to(torch.float8_e5m2))


def test_forward_and_cpu_dequantize_once_agree() -> None:
    x, w = gaussian(5, 32, seed=40), gaussian(16, 32, seed=41)
    first = fp8_layer(RowParallelLinear(32, 16))
    model = nn.Sequential(first)
    load(first.weight, w)
    q, scale = first.weight.detach().clone(), first.weight_scale.detach().clone()
    before = model(x)
    torch.testing.assert_close(before, fp8_linear(x, q, scale, None), rtol=0, atol=0)
    assert dequantize_linears(model, torch.float32) == 1
    layer = model[0]
    assert isinstance(layer, RowParallelLinear)
    assert layer.linear_method is None and layer.weight.dtype == torch.float32
    assert "weight_scale" not in dict(layer.named_parameters())
    assert torch.equal(layer.weight, dequantize_rows(q, scale, torch.float32))
    torch.testing.assert_close(model(x), before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("tokens", "n", "k"),
    [(1, 6144, 4096), (37, 4096, 4096), (512, 28672, 4096), (256, 4096, 14336)],
)
def test_cuda_fp8_gemm_against_float32(tokens: int, n: int, k: int) -> None:
    """Llama-3-8B's shapes (fused qkv, o, gate/up, down) through torch._scaled_mm."""
    x = gaussian(tokens, k, seed=50, dtype=torch.bfloat16).cuda()
    w = gaussian(n, k, seed=51).cuda()
    q, scale = quantize_rows(w)
    assert scaled_mm_applies(x, q), torch.cuda.get_device_capability()
    # Called directly: fp8_linear sends batches of up to 16 rows to the weight-only kernel.
    out = fp8_linear_scaled_mm(x, q, scale, None)
    assert out.dtype == torch.bfloat16 and out.shape == (tokens, n)
    assert rel_err(out, F.linear(x.float(), w)) < WEIGHT_AND_ACTIVATION_BOUND
    xq, x_scale = quantize_rows(x)
    exact = F.linear(
        dequantize_rows(xq, x_scale, torch.float32), dequantize_rows(q, scale, torch.float32)
    )
    assert rel_err(out, exact) < 4e-3
