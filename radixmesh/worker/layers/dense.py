"""The one matmul every linear layer and the LM head call: y = x W^T + b.

On CPU, weights can be repacked once into oneDNN's blocked layout (`pack_for_cpu`), which
its GEMM reads without reordering on every call. Measured on the 2-core AMD EPYC (Zen 4)
test machine, smollm2 shapes, 2 threads: gate/up at 32 rows 0.82 -> 0.55 ms (fp32), the
49152-row LM head 26 -> 10.6 ms at 32 rows; bf16 halves both again. (PyTorch's default
fp32 path is MKL, which runs a generic code path on AMD processors.)

After packing, the plain weight is released to keep memory flat, so packing is the last
thing done to a loaded model: weight loaders no longer apply.

A layer may instead hand its weight to a quantization method (layers/quantization/),
which then owns the weight's parameters and the layer's matmul (`PackableLinear.matmul`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers.parallel import SINGLE, TPGroup
from radixmesh.worker.layers.weights import Loaded, ShardId

if TYPE_CHECKING:
    from radixmesh.worker.layers.quantization.base import LinearMethod
    from radixmesh.worker.layers.quantization.fp8_activation import Fp8Activation


@functools.cache
def onednn_packing_available(dtype: torch.dtype = torch.float32) -> bool:
    """oneDNN's packed-weight ops exist in this torch build and pack `dtype` on this CPU:
    bf16 needs AVX-512 (or AVX-NE-CONVERT), and on a CPU with AVX2 only the reorder raises,
    so it is tried once on a small weight."""
    if not (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype))
    except RuntimeError:
        return False
    return True


def dense(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    packed: torch.Tensor | None,
) -> torch.Tensor:
    """x [T, in] -> [T, out] with W [out, in] (or its packed form)."""
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


# Deterministic mode's CPU GEMMs run in blocks of exactly this many rows, one call each.
# oneDNN and MKL pick their kernels and K blocking by the row count: on an AMD EPYC (torch
# 2.13) MKL's float32 kernels gave a row other bits below 12 rows, and on an Intel Xeon
# with AMX oneDNN's bf16 kernels gave a row other bits at 25 rows than at 40, and 16-row
# calls other bits than one 64-row call. With every call the same shape, a row's bits
# depend on its own values only: measured on both machines for smollm2's shapes and its
# LM head, float32 and bf16, packed and not, at every row count to 40 and at other
# positions in a block. The cost is the calls: a 512-row prefill's GEMMs 1.9x (bf16) to
# 2.6x (float32) the time of one call each on the Xeon; 16 rows keeps a decode step's
# padding where it was.
CPU_BLOCK_ROWS = 16


def dense_batch_invariant(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    packed: torch.Tensor | None,
) -> torch.Tensor:
    """`dense` whose row i depends on x[i] only, not on how many rows come with it
    (worker/deterministic.py). CUDA: the fixed-tile Triton matmul. CPU: blocks of
    CPU_BLOCK_ROWS rows, one call each (zero rows appended to the last, their outputs
    dropped)."""
    if x.is_cuda and packed is None:
        from radixmesh.worker.layers.kernels import batch_invariant_matmul as bim

        if bim.supports(x, weight):
            return bim.linear(x, weight, bias)
    if x.is_cuda:
        return dense(x, weight, bias, packed)
    t, b = x.shape[0], CPU_BLOCK_ROWS
    rows = -(-t // b) * b
    if rows > t:
        x = torch.cat([x, x.new_zeros(rows - t, x.shape[1])])  # [rows, in]
    if rows == b:
        return dense(x, weight, bias, packed)[:t]
    return torch.cat([dense(x[i : i + b], weight, bias, packed) for i in range(0, rows, b)])[:t]


class PackableLinear(nn.Module):
    """Mixin state for a layer whose `weight` [out, in] may be packed for CPU GEMMs, or
    quantized (then `linear_method` is set and may add parameters such as weight_scale)."""

    weight: nn.Parameter
    packed_weight: torch.Tensor | None = None
    linear_method: LinearMethod | None = None
    weight_scale: nn.Parameter
    # Deterministic mode (worker/deterministic.py): GEMMs whose rows do not depend on M;
    # on CUDA through cuBLAS where its check passed for this shape (layers/cublas_check.py).
    batch_invariant: bool = False
    cublas_invariant: bool = False
    tp: TPGroup = SINGLE  # the sharded layers set their own

    def weight_loader(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
        """Copy this rank's part of the full checkpoint tensor `loaded` into `param`."""
        raise NotImplementedError

    def output_rows(self, shard_id: ShardId) -> int:
        """Rows (output features) of the full checkpoint tensor that `shard_id` names."""
        raise NotImplementedError

    def input_columns(self) -> int:
        """Columns (input features) of the full checkpoint tensor, all ranks together."""
        raise NotImplementedError

    def wants_fp8_input(self, x: torch.Tensor) -> bool:
        """Whether the op producing this layer's input, with the rows, dtype and device of
        x, should hand it over quantized (an `Fp8Activation`, quantization/fp8.py): the
        method asks for it, on one rank, outside deterministic mode."""
        method = self.linear_method
        return (
            method is not None
            and not self.batch_invariant
            and self.tp.size == 1
            and method.wants_fp8_input(self, x)
        )

    def matmul(self, x: torch.Tensor | Fp8Activation, bias: torch.Tensor | None) -> torch.Tensor:
        """x [T, in] -> [T, out]: through the quantization method if any (which alone
        takes an `Fp8Activation`)."""
        if self.linear_method is not None:
            return self.linear_method.apply(self, x, bias)
        assert isinstance(x, torch.Tensor), "a quantized input for an unquantized layer"
        if self.batch_invariant and not self.cublas_invariant:
            return dense_batch_invariant(x, self.weight, bias, self.packed_weight)
        return dense(x, self.weight, bias, self.packed_weight)

    def pack_for_cpu(self, *, release: bool = True) -> None:
        packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())
        self.packed_weight = packed
        if release:  # the packed copy replaces it (an empty placeholder keeps the attribute)
            self.weight = nn.Parameter(self.weight.new_empty(0), requires_grad=False)


def pack_model_for_cpu(model: nn.Module) -> int:
    """Pack every packable layer of a loaded CPU model; returns how many were packed.

    A no-op (0) off CPU, for dtypes oneDNN does not pack (here), or when the ops are
    missing.
    A weight shared with another module (a tied LM head) is packed without releasing it.
    """
    layers = [m for m in model.modules() if isinstance(m, PackableLinear)]
    if not layers or layers[0].weight.device.type != "cpu":
        return 0
    dtype = layers[0].weight.dtype
    if dtype not in (torch.float32, torch.bfloat16) or not onednn_packing_available(dtype):
        return 0
    owners: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    for layer in layers:
        layer.pack_for_cpu(release=owners.get(id(layer.weight), 0) <= 1)
    return len(layers)
