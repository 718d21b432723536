"""Fused Triton kernels for the decoder layer's small ops (norm, rotary, activation).

- `rms_norm`: RMSNorm of each row, alone or fused with the residual add before it.
- `rotary`: rotary embedding of q and k in place, in the fused qkv projection's output.
- `silu_mul`: SiLU(gate) * up over the fused gate/up projection's output.
- `fp8_quant`: per-token FP8 quantization of a linear layer's input (FP8 weights);
  `rms_norm` and `silu_mul` can quantize their output the same way themselves
  (`*_fp8`), for the FP8 GEMM after them (quantization/fp8.py).
- `fused_moe`: a mixture of experts' projections as grouped GEMMs over the pairs sorted
  by expert on the device (layers/moe.py).

A decode step launches a kernel per op and per layer, and each tiny kernel costs a few
microseconds however small its tensor; fusing turns 2 norms + 2 adds + 4 rotary ops + 2
SiLU-mul ops per layer into 4 kernels, with the same math (same formulas, statistics in
float32, results rounded to the model dtype where the PyTorch code rounds them).

The layers (`layers/norm.py`, `layers/rotary.py`, `layers/activation.py`) keep the
PyTorch code as their CPU path and as the kernels' reference, and use these kernels only
where `enabled(tensor)` is true: the tensor is on CUDA, triton imports, and the
environment variable `RADIXMESH_FUSED_KERNELS` is not "0" (set it to "0" to run the
plain PyTorch ops on CUDA too, e.g. for an A/B comparison; it is read at each call, so
it must be set before a CUDA graph is captured). The kernel modules import triton, so the
layers import them lazily; on a machine without a GPU set `TRITON_INTERPRET=1` before
the first import to run them in triton's interpreter.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

ENV_SWITCH = "RADIXMESH_FUSED_KERNELS"
# The row-wise norm holds a whole row in one block: enough for hidden sizes up to 16384
# (Llama 3.1 405B); wider rows take the PyTorch path.
MAX_NORM_HIDDEN = 16384


@functools.cache
def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def enabled(t: torch.Tensor) -> bool:
    """Whether the fused kernels handle ops on `t`: CUDA, triton installed, not switched off."""
    return t.is_cuda and os.environ.get(ENV_SWITCH, "1") != "0" and _triton_available()
