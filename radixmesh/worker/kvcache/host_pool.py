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
the copy kernels address them through unified virtual addressing. They are allocated
plainly and then registered with the driver (`cudaHostRegister`), not taken from torch's
pinned allocator, which rounds every block up to a power of two (a 34 GB pool would pin
64 GB); the registration is undone when the pool is collected. Slot 0 is reserved as in
the device pool (the host allocator is a `KVAllocator`, which never hands it out).
"""

from __future__ import annotations

import weakref

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
        self.pinned = pin
        shape = (num_slots, pool.num_layers, 2, self.row)
        self.data = self._empty(shape, pool.dtype)
        self.scales: torch.Tensor | None = None
        if pool.quantized:
            scale_shape = (num_slots, pool.num_layers, 2, pool.num_kv_heads)
            self.scales = self._empty(scale_shape, torch.int8)

    def _empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype)
        if self.pinned:
            _register(t)
            weakref.finalize(self, _unregister, t.data_ptr())
        return t

    @staticmethod
    def bytes_per_slot(pool: KVPool) -> int:
        """What one host slot costs: the same bytes as one device slot."""
        return KVPool.bytes_per_slot(pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype)

    @property
    def nbytes(self) -> int:
        n = self.data.numel() * self.data.element_size()
        return n + (self.scales.numel() if self.scales is not None else 0)


# cudaHostRegisterPortable | cudaHostRegisterMapped: every device may read the rows, at
# the same address (unified virtual addressing).
_REGISTER_FLAGS = 1 | 2


def _register(t: torch.Tensor) -> None:
    rc = torch.cuda.cudart().cudaHostRegister(
        t.data_ptr(), t.numel() * t.element_size(), _REGISTER_FLAGS
    )
    if int(getattr(rc, "value", rc)) != 0:
        raise RuntimeError(
            f"host_kv_cache_bytes: cannot pin {t.numel() * t.element_size()} bytes ({rc})"
        )


def _unregister(ptr: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(ptr)
