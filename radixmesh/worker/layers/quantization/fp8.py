"""FP8 (e4m3) linear layers: float8_e4m3fn weights with a float32 scale per output channel.

Weights: W[o, :] ~= Q[o, :] * s[o], s[o] = max|W[o, :]| / 448 (e4m3's largest finite
value), so each row uses the format's whole range. A row's scale depends on that row
only, so quantizing a checkpoint tensor before the layer narrows it to this rank's rows
gives every rank exactly the rows a single GPU would hold; a row-parallel layer's ranks
all use the full row's scale. Checkpoints already in FP8 load their values unchanged: a
per-tensor scale becomes the same scale on every row of that tensor (exact, also when
q/k/v with different scales are fused into one weight).

Matmul on CUDA (`torch._scaled_mm`, sm90+, bfloat16): activations are quantized per
token, dynamically (x[t, :] ~= X[t, :] * a[t], a[t] = max|x[t, :]| / 448), and the GEMM
applies both scales to its float32 accumulators (row-wise scaling). Per token rather than
per tensor: one outlier token (the first token's huge activations are common in Llama
models) would otherwise squeeze every other token of the batch into e4m3's subnormals;
a per-token scale needs no calibration and no global reduction across the batch, and
the GEMM costs the same. Decode batches of at most 16 rows on CUDA take a weight-only
kernel instead (`layers/kernels/fp8_small_m.py`: the e4m3 weights read once and converted
in registers, the activations as they are), where the GEMM is bound by reading weights
and `_scaled_mm` is not (bench/fp8_gemm.py; `RADIXMESH_FP8_SMALL_M=0` turns it off for an
A/B). Elsewhere, and as the reference: dequantize, then an ordinary matmul in the
activations' dtype.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers.quantization.base import LinearMethod, QuantizableLinear
from radixmesh.worker.layers.weights import (
    Loaded,
    ShardId,
    as_tensor,
    mark_optional,
    set_weight_loader,
)

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
# A zero row or token gets this scale instead of 0 (its values quantize to 0 either way).
MIN_SCALE = 1e-12


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [rows, cols] -> (FP8 [rows, cols], float32 scales [rows]): w ~= q * scale[:, None]."""
    w32 = w.float()
    amax = w32.abs().amax(dim=-1)
    # A tensor divisor: CUDA divides by a Python scalar as a multiplication by its
    # reciprocal (1 ulp off now and then); IEEE division matches the Triton kernels.
    scale = (amax / torch.full_like(amax, FP8_MAX)).clamp_min(MIN_SCALE)
    q = (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale[:, None]).to(dtype)


def fp8_linear_ref(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Dequantize-then-matmul in x's dtype: the CPU path and the reference."""
    return F.linear(x, dequantize_rows(q, scale, x.dtype), bias)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, in] -> (FP8 [T, in], float32 [T]): `quantize_rows`, one kernel on CUDA."""
    from radixmesh.worker.layers import kernels

    if kernels.enabled(x) and x.stride(-1) == 1:
        from radixmesh.worker.layers.kernels.fp8_quant import per_token_fp8

        return per_token_fp8(x)
    return quantize_rows(x)


def fp8_linear_scaled_mm(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [T, in] quantized per token, times q [out, in] with row-wise scales, in x's dtype."""
    xq, x_scale = quantize_per_token(x)  # [T, in] FP8, [T] float32
    y = torch._scaled_mm(
        xq,
        q.t(),  # [in, out], column-major: the layout the FP8 GEMM wants
        scale_a=x_scale[:, None],  # [T, 1]
        scale_b=scale[None, :],  # [1, out]
        out_dtype=x.dtype,
    )
    return y if bias is None else y + bias


@functools.cache
def _device_has_fp8_gemm(index: int) -> bool:
    # Row-wise scaled FP8 GEMMs: Hopper (sm90) and later.
    return torch.cuda.get_device_capability(index) >= (9, 0)


def scaled_mm_applies(x: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether `fp8_linear` takes `_scaled_mm`: CUDA sm90+, bfloat16 activations (row-wise
    scaling returns bfloat16), and both GEMM dims multiples of 16 (a cuBLASLt rule)."""
    return (
        x.is_cuda
        and x.dtype == torch.bfloat16
        and q.shape[0] % 16 == 0
        and q.shape[1] % 16 == 0
        and _device_has_fp8_gemm(x.device.index or 0)
    )


SMALL_M_SWITCH = "RADIXMESH_FP8_SMALL_M"


def small_m_applies(x: torch.Tensor, q: torch.Tensor) -> bool:
    """Whether `fp8_linear` takes the small-batch kernel: a few rows of 16-bit activations
    on CUDA with the fused kernels on, unit column strides, not switched off."""
    from radixmesh.worker.layers import kernels

    if not (kernels.enabled(x) and x.dtype in (torch.bfloat16, torch.float16)):
        return False
    from radixmesh.worker.layers.kernels.fp8_small_m import MAX_ROWS

    return (
        x.dim() == 2
        and 0 < x.shape[0] <= MAX_ROWS
        and x.stride(-1) == 1
        and q.stride(-1) == 1
        and os.environ.get(SMALL_M_SWITCH, "1") != "0"
    )


def fp8_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [T, in] @ (q [out, in] * scale [out, 1])^T + bias -> [T, out] in x's dtype."""
    if x.is_cuda and small_m_applies(x, q):
        from radixmesh.worker.layers.kernels.fp8_small_m import fp8_small_m_linear

        return fp8_small_m_linear(x, q, scale, bias)
    if x.shape[0] > 0 and scaled_mm_applies(x, q):
        return fp8_linear_scaled_mm(x, q, scale, bias)
    return fp8_linear_ref(x, q, scale, bias)


class Fp8LinearMethod(LinearMethod):
    name = "fp8"

    def create_weights(self, layer: QuantizableLinear) -> None:
        old = layer.weight
        layer.weight = nn.Parameter(
            torch.empty(old.shape, dtype=FP8, device=old.device), requires_grad=False
        )
        # NaN until loaded, so `check_loaded` finds an FP8 weight whose scale never came.
        layer.weight_scale = nn.Parameter(
            torch.full((old.shape[0],), float("nan"), dtype=torch.float32, device=old.device),
            requires_grad=False,
        )
        set_weight_loader(layer.weight, functools.partial(_load_weight, layer))
        set_weight_loader(layer.weight_scale, functools.partial(_load_scale, layer))
        mark_optional(layer.weight_scale)  # computed at load from a full-precision weight
        layer.linear_method = self

    def check_loaded(self, layer: QuantizableLinear) -> None:
        if torch.isnan(layer.weight_scale).any():
            raise ValueError("an FP8 weight came without its weight_scale")

    def apply(
        self, layer: QuantizableLinear, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return fp8_linear(x, layer.weight, layer.weight_scale, bias)

    def dequantized_weight(self, layer: QuantizableLinear, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_rows(layer.weight, layer.weight_scale, dtype)


def _load_weight(
    layer: QuantizableLinear, param: nn.Parameter, loaded: Loaded, shard_id: ShardId
) -> None:
    """A checkpoint weight: FP8 values as they are (the scale is its own tensor), anything
    else quantized per row here, values and scales sliced by the layer's own loader."""
    if loaded.dtype == FP8:
        layer.weight_loader(param, loaded, shard_id)
        return
    if loaded.dtype.is_floating_point and loaded.dtype.itemsize == 1:
        raise ValueError(f"FP8 weights must be float8_e4m3fn, got {loaded.dtype}")
    q, scale = quantize_rows(as_tensor(loaded))
    layer.weight_loader(param, q, shard_id)
    layer.weight_loader(layer.weight_scale, scale, shard_id)


def _load_scale(
    layer: QuantizableLinear, param: nn.Parameter, loaded: Loaded, shard_id: ShardId
) -> None:
    """A checkpoint's weight_scale: per tensor ([] or [1]) or per output channel
    ([out] or [out, 1]); either way stored as one float32 scale per row."""
    scale = as_tensor(loaded).to(device=param.device, dtype=torch.float32).reshape(-1)
    if scale.numel() == 1:
        scale = scale.expand(layer.output_rows(shard_id))
    layer.weight_loader(param, scale, shard_id)
