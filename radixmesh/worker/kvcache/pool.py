"""The KV pool: preallocated K and V tensors per layer, indexed by slot.

Slot 0 is reserved as a padding target (padded rows of a CUDA-graph batch write there)
and is never handed out by the allocator; `num_slots` counts it.
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(
        self,
        *,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_slots < 2:
            raise ValueError(f"num_slots: need at least 2 slots (one is reserved), got {num_slots}")
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_slots, num_kv_heads, head_dim)
        # [num_slots, num_kv_heads, head_dim] per layer
        self.k_buffers = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]
        self.v_buffers = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]

    @staticmethod
    def bytes_per_slot(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * itemsize

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k_buffers, *self.v_buffers))

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k/v [T, num_kv_heads, head_dim] into slots `loc` [T] of one layer."""
        self.k_buffers[layer_id][loc] = k.to(self.dtype)
        self.v_buffers[layer_id][loc] = v.to(self.dtype)
