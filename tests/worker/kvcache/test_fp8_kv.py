"""The FP8 KV encoding (e4m3 values, a power-of-two scale per token and head) and the
FP8 pool that stores it."""

from __future__ import annotations

import math

import pytest
import torch

from radixmesh.worker.kvcache.fp8_kv import (
    FP8,
    FP8_MAX,
    dequantize_kv,
    pow2,
    quantize_kv,
    scale_exponents,
)
from radixmesh.worker.kvcache.pool import KVPool, kv_storage_dtype


@pytest.mark.parametrize("amax", [448.0, 449.0, 896.0, 1.0, 3.5e-3, 7e4, 1e-30, 0.0])
def test_exponent_is_the_smallest_that_avoids_saturation(amax: float) -> None:
    e = int(scale_exponents(torch.tensor([amax]))[0])
    if amax >= 2.0**-126 * FP8_MAX:
        assert e == math.ceil(math.log2(amax / FP8_MAX))
        assert amax / 2.0**e <= FP8_MAX < amax / 2.0 ** (e - 1)
    else:  # below float32's normal range: the smallest exponent kept
        assert e == -126


def test_pow2_is_exact() -> None:
    e = torch.arange(-126, 128, dtype=torch.int32)
    assert torch.equal(pow2(e), torch.tensor([2.0**i for i in range(-126, 128)]))


def test_round_trip_error_is_within_half_an_e4m3_step() -> None:
    gen = torch.Generator().manual_seed(0)
    # tokens x heads x dim, heads of wildly different magnitudes
    x = torch.randn(50, 4, 64, generator=gen) * torch.tensor([1e-4, 1.0, 30.0, 5e3])[:, None]
    q, e = quantize_kv(x)
    assert q.dtype == FP8 and e.dtype == torch.int8 and e.shape == (50, 4)
    # Each (token, head) uses the range: its largest element lands in [224, 448].
    peak = q.float().abs().amax(-1)
    assert bool(((peak >= FP8_MAX / 2) & (peak <= FP8_MAX)).all())
    back = dequantize_kv(q, e, torch.float32)
    # e4m3 keeps 3 mantissa bits: a normal value is off by at most 2^-4 of itself; below
    # 2^-6 (subnormal, in units of 2^e) by at most half the 2^-9 step.
    step = (2.0**-10 * pow2(e))[..., None]
    assert bool(((back - x).abs() <= torch.maximum(x.abs() * 2.0**-4, step)).all())
    assert float((back - x).norm() / x.norm()) < 0.03


def test_dequantized_values_are_exact_in_bfloat16() -> None:
    x = torch.randn(8, 2, 32, generator=torch.Generator().manual_seed(1)) * 100
    q, e = quantize_kv(x)
    assert torch.equal(
        dequantize_kv(q, e, torch.bfloat16).float(), dequantize_kv(q, e, torch.float32)
    )


def test_fp8_pool_stores_values_and_exponents_in_their_slots() -> None:
    pool = KVPool(num_slots=16, num_layers=2, num_kv_heads=3, head_dim=8, dtype=FP8, device="cpu")
    assert pool.quantized and len(pool.k_scales) == len(pool.v_scales) == 2
    assert pool.k_scales[0].shape == (16, 3) and pool.k_scales[0].dtype == torch.int8
    assert pool.nbytes == 2 * 2 * 16 * 3 * (8 + 1)
    assert pool.nbytes == 16 * KVPool.bytes_per_slot(2, 3, 8, FP8)
    gen = torch.Generator().manual_seed(2)
    k, v = torch.randn(4, 3, 8, generator=gen), torch.randn(4, 3, 8, generator=gen) * 1e3
    loc = torch.tensor([5, 1, 9, 14])
    pool.set_kv(1, loc, k, v)
    k8, k_exp = quantize_kv(k)
    v8, v_exp = quantize_kv(v)
    assert torch.equal(pool.k_buffers[1][loc].view(torch.uint8), k8.view(torch.uint8))
    assert torch.equal(pool.v_buffers[1][loc].view(torch.uint8), v8.view(torch.uint8))
    assert torch.equal(pool.k_scales[1][loc], k_exp) and torch.equal(pool.v_scales[1][loc], v_exp)
    assert not pool.k_scales[0].any() and not pool.k_buffers[0].float().any()  # other layer
    scales = pool.scales(1)
    assert scales is not None and scales[0] is pool.k_scales[1]


def test_a_16_bit_pool_has_no_scales() -> None:
    pool = KVPool(
        num_slots=4, num_layers=1, num_kv_heads=1, head_dim=8, dtype=torch.bfloat16, device="cpu"
    )
    assert not pool.quantized and pool.scales(0) is None and pool.k_scales == []


def test_kv_storage_dtype() -> None:
    assert kv_storage_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert kv_storage_dtype("fp8", torch.bfloat16) == FP8
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_storage_dtype("int4", torch.bfloat16)
