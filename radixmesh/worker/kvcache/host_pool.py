"""The host-memory KV pool: the second tier under the radix tree (host_tier.py).

One row per host slot holds that token's K and V of every layer, token-major:
`data[slot] = [num_layers, 2, num_kv_heads * head_dim]` in the device pool's storage
dtype (an FP8 pool's e4m3 bytes stay e4m3 here, and its scale exponents go to `scales`,
`[slot, num_layers, 2, num_kv_heads]`). Token-major because the tier moves whole tokens:
a node evicted from the device is copied out over every layer at once, and a row is one
contiguous run of bytes (128 KiB a token for Llama-3-8B in bf16), which is what a copy
over PCIe wants. The device pool is layer-major (attention reads one layer at a time),
so the copy kernels (host_copy.py) gather and scatter between the two layouts.

On CUDA the rows are pinned (page-locked): the GPU reads and writes them directly, and
the copy kernels address them through unified virtual addressing. Slot 0 is reserved as
in the device pool (the host allocator is a `KVAllocator`, which never hands it out).
"""

from __future__ import annotations

import torch

from radixmesh.worker.kvcache.pool import KVPool


class HostKVPool:
    def __init__(self, pool: KVPool, num_slots: int, *, pin: bool) -> None:
        if num_slots < 2:
            raise ValueError(f"host_kv_cache_bytes: room for {num_slots} host slots; need >= 2")
        self.num_slots = num_slots
        self.num_layers = pool.num_layers
        self.row = pool.num_kv_heads * pool.head_dim  # elements of one layer's K (or V)
        self.dtype = pool.dtype
        self.quantized = pool.quantized
        shape = (num_slots, pool.num_layers, 2, self.row)
        self.data = torch.empty(shape, dtype=pool.dtype, pin_memory=pin)
        self.scales: torch.Tensor | None = None
        if pool.quantized:
            scale_shape = (num_slots, pool.num_layers, 2, pool.num_kv_heads)
            self.scales = torch.empty(scale_shape, dtype=torch.int8, pin_memory=pin)

    @staticmethod
    def bytes_per_slot(pool: KVPool) -> int:
        """What one host slot costs: the same bytes as one device slot."""
        return KVPool.bytes_per_slot(pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype)

    @property
    def nbytes(self) -> int:
        n = self.data.numel() * self.data.element_size()
        return n + (self.scales.numel() if self.scales is not None else 0)
