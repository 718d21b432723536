"""FP8 (e4m3) linear layers: float8_e4m3fn weights with float32 scales.

Scales (fp8_scales.py): per output channel, W[o, :] ~= Q[o, :] * s[o], or per row and
group of 128 input columns, W[o, g*128:(g+1)*128] ~= Q[...] * s[o, g] (quantized per
1 x 128 or 128 x 128 block; both held per row). The method names pick the layout used
when a full-precision checkpoint is quantized at load: "fp8-channel", "fp8-1x128",
"fp8-128x128", and "fp8" for `DEFAULT_LAYOUT`. A scale depends on its block only, so
quantizing a checkpoint tensor before the layer narrows it to this rank's rows gives
every rank exactly the rows a single GPU would hold; a row-parallel layer's ranks use
the full row's channel scale, or their own groups' scales. Checkpoints already in FP8
load their values unchanged: a per-tensor scale becomes the same scale on every row (and
group) of that tensor (exact, also when q/k/v with different scales are fused into one
weight), a per-channel one the same scale on every group of its row, and block scales
(`weight_scale_inv` [ceil(out/128), ceil(in/128)]) are repeated on their rows.

Why per channel stays the default (docs/quantization.md has the figures): e4m3 is a
floating-point format, so a finer scale only helps values more than 448 / 2^-6 = 28672x
under their block's largest, which real weights rarely have; on the bundled SmolLM2 the
three layouts' perplexities differ by less than re-rounding the same layout moves it
(scales enlarged by a random 0-6%: +2.7% to +8.4%). Per-channel scales cost nothing in
the GEMMs (`_scaled_mm`'s row-wise scaling at large batches, one multiply after the K
loop at small ones); group scales cost a dequantize-then-GEMM at large batches (below)
and a scale per K group in the small-batch kernel. Block-scaled checkpoints load as
they are stored.

Matmul on CUDA (`torch._scaled_mm`, sm90+, bfloat16): activations are quantized per
token, dynamically (x[t, :] ~= X[t, :] * a[t], a[t] = max|x[t, :]| / 448), and the GEMM
applies both scales to its float32 accumulators (row-wise scaling). Per token rather than
per tensor: one outlier token (the first token's huge activations are common in Llama
models) would otherwise squeeze every other token of the batch into e4m3's subnormals;
a per-token scale needs no calibration and no global reduction across the batch, and
the GEMM costs the same. Decode batches of at most 16 rows on CUDA take a weight-only
kernel instead by default (`layers/kernels/fp8_small_m.py`: the e4m3 weights read once and
converted in registers, the activations as they are), where the GEMM is bound by reading
weights and `_scaled_mm` is not (bench/fp8_gemm.py). Which kernel serves such a call is
measured at load, per shape, scale layout and row bucket (fp8_gemm_choice.py: the model's
`Fp8LinearMethod.gemm_table`): `_scaled_mm` or the CUDA C++ kernel of the same job
(layers/kernels/fp8_gemv_cuda.py) replace the Triton kernel where they time more than 5%
faster on this GPU. Without a table (`RADIXMESH_FP8_GEMM_TABLE=0`, deterministic mode,
CPU) the fixed rule: the Triton kernel. Past 16 rows the same table chooses between
row-wise `_scaled_mm` (the fixed rule) and `fp8_linear_tensorwise`: the tensor-wise FP8
GEMM with unit scales into float32, then both scales in one pass
(layers/kernels/fp8_epilogue.py), which cuBLAS runs faster on narrow outputs (o, down)
at decode batches. `RADIXMESH_FP8_SMALL_M=0` turns the small-batch
kernels off for an A/B (the larger batches' path at every row count);
`RADIXMESH_FP8_SMALL_M=cuda` takes the CUDA C++ kernel wherever it applies; either
overrides the table. Group scales at more rows: dequantize, then bf16 GEMM (correct;
`_scaled_mm`'s row-wise scaling cannot apply a scale per K group, and its block-wise
modes are not measured here yet). Elsewhere, and as the reference: dequantize, then an
ordinary matmul in the activations' dtype.

Fused activation quantization: where the `_scaled_mm` path takes a layer's input (the
conditions above, more rows than the small-batch kernel's MAX_ROWS, per-channel scales)
the op that produces that input can quantize it itself and hand over an `Fp8Activation`
(fp8_activation.py: e4m3 rows, float32 per-row scales), which `fp8_linear` feeds straight
into the GEMM: no separate quantization kernel, and the 16-bit rows are never written.
The producer asks first (`PackableLinear.wants_fp8_input`, which asks
`Fp8LinearMethod.wants_fp8_input`); in the Llama decoder the input norm before q/k/v,
the post-attention norm before gate/up and SiLU-and-mul before the down projection do
(layers/kernels/rms_norm.py, silu_mul.py). The o projection's input (the attention
output) is still quantized by its own kernel. The fused kernels round each value to the
model dtype before they quantize it, so the GEMM's inputs, and the outputs, are those of
the unfused path bit for bit. Not fused: the small-batch kernel's rows, CPU, other
dtypes, tensor-parallel layers and deterministic mode (their paths are unchanged).
On by default; `RADIXMESH_FP8_FUSED_QUANT=0` turns it off (read at each call, so set it
before CUDA graphs are captured). The e4m3 store keeps the 16-bit kernel's register
layout (layers/kernels/rms_norm.py, checked by compiling both for sm_90 in the tests), so
the sum of squares runs in the same order; on the H200 (2026-12-05,
fused_ops-fp8quant-h200.json) every fused kernel gave the unfused path's bits at 256 and
8,192 rows, 4,096 and 14,336 columns, in 1/5.2 to 1/1.45 of the separate kernels' time
for add + RMSNorm and 1/6.8 to 1/1.01 for SiLU-and-mul (docs/quantization.md).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers.quantization.base import LinearMethod, QuantizableLinear
from radixmesh.worker.layers.quantization.fp8_activation import Fp8Activation, quantize_per_token
from radixmesh.worker.layers.quantization.fp8_gemm_table import GemmTable
from radixmesh.worker.layers.quantization.fp8_scales import (
    FP8,
    FP8_MAX,
    GROUP_K,
    MIN_SCALE,
    SCALE_LAYOUTS,
    checkpoint_scales,
    dequantize_rows,
    quantize,
    quantize_rows,
)
from radixmesh.worker.layers.weights import (
    Loaded,
    ShardId,
    as_tensor,
    mark_optional,
    set_weight_loader,
)

# The layout `fp8` quantizes full-precision weights to (measured: docs/quantization.md).
DEFAULT_LAYOUT = "channel"


def fp8_linear_ref(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Dequantize-then-matmul in x's dtype (per-channel [out] or group scales [out,
    groups]): the CPU path, the reference, and group scales' large-batch path."""
    return F.linear(x, dequantize_rows(q, scale, x.dtype), bias)


def _scaled_mm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Per-token e4m3 rows xq [T, in] (scales [T]) times q [out, in] with row-wise scales,
    in `dtype`."""
    y = torch._scaled_mm(
        xq,
        q.t(),  # [in, out], column-major: the layout the FP8 GEMM wants
        scale_a=x_scale[:, None],  # [T, 1]
        scale_b=scale[None, :],  # [1, out]
        out_dtype=dtype,
    )
    return y if bias is None else y + bias


def fp8_linear_scaled_mm(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [T, in] quantized per token, times q [out, in] with row-wise scales, in x's dtype."""
    xq, x_scale = quantize_per_token(x)  # [T, in] FP8, [T] float32
    return _scaled_mm(xq, x_scale, q, scale, bias, x.dtype)


def fp8_activation_scaled_mm(
    x: Fp8Activation, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`fp8_linear_scaled_mm` of an input its producer already quantized per token."""
    return _scaled_mm(x.values, x.scales, q, scale, bias, x.dtype)


@functools.cache
def unit_scale(index: int) -> torch.Tensor:
    """A float32 1.0 on CUDA device `index`: the tensor-wise GEMM's scales, made once.
    Made outside any CUDA graph capture (fp8_gemm_choice.prepare makes it at load): made
    inside one, its fill would only be recorded, not run, and an eager call before the
    graph's first replay would read uninitialized memory."""
    return torch.ones((), dtype=torch.float32, device=torch.device("cuda", index))


def _tensorwise_mm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """`_scaled_mm`'s result another way: the tensor-wise FP8 GEMM with unit scales into
    float32, then the row and channel scales (and bias) in one pass, rounded once to
    `dtype` (layers/kernels/fp8_epilogue.py says why and where it pays)."""
    from radixmesh.worker.layers.kernels.fp8_epilogue import scale_rows_cols

    one = unit_scale(xq.device.index or 0)
    acc = torch._scaled_mm(xq, q.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    return scale_rows_cols(acc, x_scale, scale, bias, dtype)


def fp8_linear_tensorwise(
    x: torch.Tensor | Fp8Activation,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """`fp8_linear_scaled_mm` (or, for an `Fp8Activation`, `fp8_activation_scaled_mm`)
    through the tensor-wise GEMM and the scales' epilogue."""
    if isinstance(x, Fp8Activation):
        return _tensorwise_mm(x.values, x.scales, q, scale, bias, x.dtype)
    xq, x_scale = quantize_per_token(x)
    return _tensorwise_mm(xq, x_scale, q, scale, bias, x.dtype)


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


FUSED_QUANT_SWITCH = "RADIXMESH_FP8_FUSED_QUANT"


def fused_quant_applies(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether the input of an FP8 linear with rows, dtype and device of x [T, *] may come
    already quantized (an `Fp8Activation`): `fp8_linear` would take `_scaled_mm` for it
    with more rows than the small-batch kernel's MAX_ROWS, the fused kernels are on (the
    producer's kernel quantizes), and `RADIXMESH_FP8_FUSED_QUANT` is not "0"."""
    # Asked three times a layer per forward: the switch (on by default) first.
    if os.environ.get(FUSED_QUANT_SWITCH, "1") == "0":
        return False
    from radixmesh.worker.layers import kernels

    if x.dim() != 2 or scale.dim() != 1 or not kernels.enabled(x):
        return False
    from radixmesh.worker.layers.kernels.fp8_small_m import MAX_ROWS

    return x.shape[0] > MAX_ROWS and scaled_mm_applies(x, q)


def fp8_linear(
    x: torch.Tensor | Fp8Activation,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    table: GemmTable | None = None,
) -> torch.Tensor:
    """x [T, in] @ (q [out, in] * scale)^T + bias -> [T, out] in x's dtype; scale [out]
    per channel or [out, ceil(in/128)] per row and group. An `Fp8Activation` x (given only
    where `fused_quant_applies`) goes straight into `_scaled_mm`. `table` (the model's,
    measured at load: fp8_gemm_choice.py) may send a call to another kernel than the
    fixed rule's: at most 16 rows, the small-batch one's; more, row-wise `_scaled_mm`'s."""
    if isinstance(x, Fp8Activation):
        if scale.dim() != 1:
            raise ValueError("a quantized input needs per-channel weight scales (_scaled_mm)")
        rows = x.values.shape[0]
        if table is not None and table.kernel_for(rows, x.dtype, q, scale) == "tensorwise_mm":
            return fp8_linear_tensorwise(x, q, scale, bias)
        return fp8_activation_scaled_mm(x, q, scale, bias)
    # The table's kernels applied to this shape, dtype and device when it was measured.
    kernel = table.kernel_for(x.shape[0], x.dtype, q, scale) if table is not None else None
    if x.is_cuda and small_m_applies(x, q):
        from radixmesh.worker.layers.kernels import fp8_gemv_cuda

        if fp8_gemv_cuda.applies(x, q, scale):  # RADIXMESH_FP8_SMALL_M=cuda
            return fp8_gemv_cuda.fp8_gemv_cuda(x, q, scale, bias)
        if kernel == "scaled_mm":
            return fp8_linear_scaled_mm(x, q, scale, bias)
        if kernel == "tensorwise_mm":
            return fp8_linear_tensorwise(x, q, scale, bias)
        if kernel == "cuda_gemv" and fp8_gemv_cuda.shapes_fit(x, q, scale):
            return fp8_gemv_cuda.fp8_gemv_cuda(x, q, scale, bias)
        from radixmesh.worker.layers.kernels.fp8_small_m import fp8_small_m_linear

        return fp8_small_m_linear(x, q, scale, bias)
    if x.shape[0] > 0 and scale.dim() == 1 and scaled_mm_applies(x, q):
        if kernel == "tensorwise_mm":
            return fp8_linear_tensorwise(x, q, scale, bias)
        return fp8_linear_scaled_mm(x, q, scale, bias)
    return fp8_linear_ref(x, q, scale, bias)


class Fp8LinearMethod(LinearMethod):
    """FP8 weights; `layout` is how a full-precision weight is quantized at load
    (fp8_scales.SCALE_LAYOUTS) and so the shape of the layer's scales."""

    def __init__(self, layout: str = DEFAULT_LAYOUT) -> None:
        if layout not in SCALE_LAYOUTS:
            raise ValueError(f"layout must be one of {SCALE_LAYOUTS}, got {layout!r}")
        self.layout = layout
        self.name = "fp8" if layout == DEFAULT_LAYOUT else f"fp8-{layout}"
        # The model's kernel choices per shape and row bucket, set at load
        # (fp8_gemm_choice.prepare); None: the fixed rule.
        self.gemm_table: GemmTable | None = None

    def create_weights(self, layer: QuantizableLinear) -> None:
        old = layer.weight
        out, cols = old.shape
        grouped = self.layout != "channel"
        if grouped and cols % GROUP_K and cols != layer.input_columns():
            raise ValueError(
                f"FP8 {self.layout} scales: this rank's {cols} input columns are not a "
                f"multiple of {GROUP_K}, so a scale group would straddle ranks; use fp8-channel"
            )
        layer.weight = nn.Parameter(
            torch.empty(old.shape, dtype=FP8, device=old.device), requires_grad=False
        )
        # NaN until loaded, so `check_loaded` finds an FP8 weight whose scale never came.
        shape = (out, -(-cols // GROUP_K)) if grouped else (out,)
        layer.weight_scale = nn.Parameter(
            torch.full(shape, float("nan"), dtype=torch.float32, device=old.device),
            requires_grad=False,
        )
        set_weight_loader(layer.weight, functools.partial(_load_weight, self.layout, layer))
        set_weight_loader(layer.weight_scale, functools.partial(_load_scale, layer))
        mark_optional(layer.weight_scale)  # computed at load from a full-precision weight
        layer.linear_method = self

    def check_loaded(self, layer: QuantizableLinear) -> None:
        if torch.isnan(layer.weight_scale).any():
            raise ValueError("an FP8 weight came without its weight_scale")

    def apply(
        self,
        layer: QuantizableLinear,
        x: torch.Tensor | Fp8Activation,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        return fp8_linear(x, layer.weight, layer.weight_scale, bias, self.gemm_table)

    def wants_fp8_input(self, layer: QuantizableLinear, x: torch.Tensor) -> bool:
        return fused_quant_applies(x, layer.weight, layer.weight_scale)

    def dequantized_weight(self, layer: QuantizableLinear, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_rows(layer.weight, layer.weight_scale, dtype)


def method_for(name: str) -> Fp8LinearMethod:
    """ "fp8" (the default layout) or "fp8-<layout>"."""
    return Fp8LinearMethod(DEFAULT_LAYOUT if name == "fp8" else name.removeprefix("fp8-"))


def _load_weight(
    layout: str, layer: QuantizableLinear, param: nn.Parameter, loaded: Loaded, shard_id: ShardId
) -> None:
    """A checkpoint weight: FP8 values as they are (the scale is its own tensor), anything
    else quantized here in the method's layout, values and scales sliced by the layer's
    own loader."""
    if loaded.dtype == FP8:
        layer.weight_loader(param, loaded, shard_id)
        return
    if loaded.dtype.is_floating_point and loaded.dtype.itemsize == 1:
        raise ValueError(f"FP8 weights must be float8_e4m3fn, got {loaded.dtype}")
    q, scale = quantize(as_tensor(loaded), layout)
    layer.weight_loader(param, q, shard_id)
    layer.weight_loader(layer.weight_scale, scale, shard_id)


def _load_scale(
    layer: QuantizableLinear, param: nn.Parameter, loaded: Loaded, shard_id: ShardId
) -> None:
    """A checkpoint's weight_scale (or weight_scale_inv): per tensor ([] or [1]), per
    output channel ([out] or [out, 1]) or per block ([ceil(out/b), ceil(in/128)], b 1 or
    128), brought to the layer's form: [out] for channel scales, [out, groups] for group
    scales (a coarser scale repeated over rows and groups, exactly)."""
    stored = as_tensor(loaded).to(device=param.device)
    cols = layer.input_columns()
    scale = checkpoint_scales(stored, layer.output_rows(shard_id), cols)  # [out] or [out, groups]
    if param.dim() == 1:
        if scale.dim() == 2:
            raise ValueError(
                f"block scales {tuple(stored.shape)} for an FP8 layer with one scale per "
                "channel (load this checkpoint with quantization fp8 or fp8-128x128)"
            )
        layer.weight_loader(param, scale, shard_id)
        return
    if scale.dim() == 1:  # per tensor or per channel: the same scale on every group of a row
        scale = scale[:, None].expand(-1, -(-cols // GROUP_K))
    layer.weight_loader(param, scale.contiguous(), shard_id)


__all__ = ["FP8", "FP8_MAX", "MIN_SCALE", "Fp8Activation", "dequantize_rows", "quantize_rows"]
