"""Small all-reduces of a CUDA TP group in one kernel, through PyTorch symmetric memory.

A decode step all-reduces two `[batch, hidden]` activations per layer (o_proj and
down_proj outputs, RowParallelLinear): 65 calls per step for Llama-3-8B, each a few KB to
a few MB. NCCL's ring LL kernel took ~7 us a call inside the batch-1 decode graph on two
H200s (0.47 ms of a 3.4 ms step); PyTorch's `symm_mem.one_shot_all_reduce` has each rank
read the others' buffers directly over NVLink and sum them in one kernel (7.5 vs 14.3 us a
call in a graph-captured loop of 64, bench/allreduce.py, 2026-11-30). The input is copied
into this rank's symmetric buffer first (the kernel reads peers' buffers only), then the
sum is written back in place, so callers see `dist.all_reduce` semantics.

Multicast (NVLink SHARP) stays off: `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`, as NCCL's
`NCCL_NVLS_ENABLE=0` (the one-shot kernel needs only peer loads). Tensors larger than the
buffer, of another dtype, or not contiguous go to NCCL (`__call__` returns False).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

logger = logging.getLogger(__name__)

MAX_BYTES = 4 * 1024 * 1024  # a decode step's [256, 8192] bf16; prefill chunks use NCCL


class OneShotAllReduce:
    """Construct on every rank of the group, in the same order (the rendezvous is a
    collective); then `fn(x)` all-reduces `x` in place and returns True, or returns
    False for tensors it does not take."""

    def __init__(
        self, group: Any, device: torch.device, dtype: torch.dtype, max_bytes: int = MAX_BYTES
    ) -> None:  # group: a torch.distributed ProcessGroup
        os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name: str = group.group_name
        self.dtype = dtype
        numel = max_bytes // dtype.itemsize
        self.buf = symm_mem.empty(numel, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buf, group)
        ops = torch.ops.symm_mem
        self._out = getattr(ops, "one_shot_all_reduce_out", None)
        self._new = ops.one_shot_all_reduce

    def __call__(self, x: torch.Tensor) -> bool:
        if x.dtype != self.dtype or x.numel() > self.buf.numel() or not x.is_contiguous():
            return False
        view = self.buf[: x.numel()].view_as(x)
        view.copy_(x)
        if self._out is not None:
            self._out(view, "sum", self.group_name, x)
        else:
            x.copy_(self._new(view, "sum", self.group_name))
        return True


def try_one_shot(device: torch.device, dtype: torch.dtype) -> OneShotAllReduce | None:
    """The one-shot all-reduce for this process's (default) TP group, or None where it
    cannot be had (no CUDA, a torch without symmetric memory, no peer access); the layers
    then all-reduce through NCCL. Every rank must call this at the same point."""
    if device.type != "cuda":
        return None
    import torch.distributed as dist

    group = dist.group.WORLD
    if group is None:
        return None
    try:
        return OneShotAllReduce(group, device, dtype)
    except Exception as e:  # e.g. no P2P between the GPUs: NCCL works everywhere
        logger.warning("one-shot all-reduce unavailable (%s: %s): using NCCL", type(e).__name__, e)
        return None
