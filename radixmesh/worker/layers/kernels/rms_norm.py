"""RMSNorm of each row, alone or fused with the residual add before it.

One program per row holds the whole row in one block (BLOCK = next power of two of the
hidden size, at most MAX_NORM_HIDDEN): the row is read once and written once, with no
second pass. `fused_add_rms_norm` first forms s = x + residual rounded to the input
dtype (as PyTorch's `residual + x` rounds it), stores s into `residual` in place, then
normalizes s; the normed rows always go to a new tensor, so `x` is left as it was.
Statistics and the weight multiply are in float32: (s * rsqrt(mean(s^2) + eps)) * w,
rounded once to x's dtype, as `F.rms_norm` computes it.

`rms_norm_fp8` and `fused_add_rms_norm_fp8` write the normed rows as e4m3 with one
float32 scale per row instead (the next layer is an FP8 linear on the `_scaled_mm` path):
the row in registers is rounded to x's dtype first, exactly as the 16-bit output is, and
then quantized as `fp8_quant.py` quantizes that output (max|y| / 448, IEEE division,
round to nearest even). So the e4m3 values and scales are bit for bit those of the
unfused path (norm, then the quantization kernel) and the model's outputs do not change;
quantizing the float32 row instead would skip one rounding but give other bits than the
path it replaces, for no accuracy that e4m3's 3-bit mantissa could keep.

Equal bits also need the same sum of squares, and its order of additions follows the
row's register layout, which triton's coalescing pass picks from the memory accesses:
each load or store asks for up to 16 bytes a thread, and the row's tensors take the
largest of those. The 16-bit kernel's accesses all ask for 8 bf16 (4 float32), but an
e4m3 store asks for 16 bytes = 16 values, so the fused kernel held the row 16 values a
thread instead of 8 (the fused add: loads and sum in 16, the residual store converted
back to 8 through shared memory): each thread summed other values, the partial sums met
in another order, rsqrt(mean) moved in its last bit in about one row in eight, and now
and then an output rounded the other way (an H200 measured other e4m3 bits; the
interpreter, adding in its own order either way, cannot show it). So the e4m3 store is
declared contiguous only in runs of VEC, the values in 16 bytes of x's dtype
(`tl.max_contiguous`: a weaker claim than the row's full contiguity, so a true one): it
then asks for what the 16-bit store asks for, and both variants compile the norm to one
layout and the same instructions, the 16-bit kernel's unchanged. That is the lever plain
`tl` has over the layout (gluon's explicit layouts would leave the interpreter), and a
sum in an order no layout changes would cost the kernel more. The e4m3 row is written
VEC bytes a thread (8 for bf16, as `fp8_quant.py` writes it); the loads stay 16 bytes.
tests/worker/layers/kernels/test_fused_fp8_layouts.py compiles both variants for sm_90
and compares them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixmesh.worker.layers.kernels import MAX_NORM_HIDDEN
from radixmesh.worker.layers.kernels.fp8_quant import quantize_e4m3, token_scale

FP8 = torch.float8_e4m3fn


@triton.jit
def _rms_norm_kernel(
    X,
    Residual,
    Weight,
    Out,
    Scale,
    stride_x,
    stride_r,
    stride_out,
    eps,
    HIDDEN: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    QUANT: tl.constexpr,
    BLOCK: tl.constexpr,
    VEC: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(Residual + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(Residual + row * stride_r + offs, x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.math.div_rn(tl.sum(xf * xf, axis=0), HIDDEN)  # IEEE division, as torch
    rstd = tl.math.rsqrt(mean_sq + eps)
    w = tl.load(Weight + offs, mask=mask, other=0.0).to(tl.float32)
    y = (xf * rstd * w).to(X.dtype.element_ty)  # the 16-bit output (0 past the row)
    if QUANT:  # Out is e4m3: y quantized over its row, the scale into Scale
        yf = y.to(tl.float32)
        scale = token_scale(tl.max(tl.abs(yf), 0))
        tl.store(Scale + row, scale)
        y = quantize_e4m3(yf, scale)
    out = Out + row * stride_out + offs
    if QUANT:  # the 16-bit store's layout (see above): VEC e4m3 a thread, not 16
        out = tl.max_contiguous(out, VEC)
    tl.store(out, y.to(Out.dtype.element_ty), mask=mask)


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    quant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(normed rows in x's shape and dtype, None), or with `quant` (e4m3 [rows, hidden],
    float32 scales [rows])."""
    hidden = x.shape[-1]
    if hidden > MAX_NORM_HIDDEN:
        raise ValueError(f"hidden size {hidden} > {MAX_NORM_HIDDEN}: use the PyTorch path")
    assert weight.shape == (hidden,), (weight.shape, hidden)
    x2 = x.reshape(-1, hidden)  # a view for the contiguous rows the model passes
    r2 = x2 if residual is None else residual.view(-1, hidden)  # in place: must be a view
    assert x2.stride(-1) == r2.stride(-1) == 1 and r2.shape == x2.shape and r2.dtype == x.dtype
    rows = x2.shape[0]
    scale = None
    if quant:
        out = torch.empty((rows, hidden), dtype=FP8, device=x.device)
        scale = torch.empty((rows,), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty_like(x2, memory_format=torch.contiguous_format)
    if rows > 0:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(rows,)](
            x2,
            r2,
            weight,
            out,
            out if scale is None else scale,  # not read without QUANT
            x2.stride(0),
            r2.stride(0),
            out.stride(0),
            eps,
            HIDDEN=hidden,
            HAS_RESIDUAL=residual is not None,
            QUANT=quant,
            BLOCK=block,
            VEC=min(16 // x.element_size(), block),  # values in 16 bytes of x's dtype
            num_warps=min(max(block // 512, 1), 16),
            enable_fp_fusion=False,
        )
    return (out, scale) if quant else (out.view(x.shape), None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [..., hidden] (rows with unit stride) times weight [hidden]; a new tensor."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual += x in place (rounded to the dtype), then RMSNorm of it into a new tensor."""
    return _launch(x, residual, weight, eps)[0]


def rms_norm_fp8(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rms_norm` of x [..., hidden] quantized per row: (e4m3 [rows, hidden], float32
    scales [rows]), equal to `quantize_rows(rms_norm(x, weight, eps))` bit for bit."""
    q, scale = _launch(x, None, weight, eps, quant=True)
    assert scale is not None
    return q, scale


def fused_add_rms_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm` (residual += x in place) with the normed rows quantized per
    row: (e4m3 [rows, hidden], float32 scales [rows]), as `rms_norm_fp8`."""
    q, scale = _launch(x, residual, weight, eps, quant=True)
    assert scale is not None
    return q, scale
