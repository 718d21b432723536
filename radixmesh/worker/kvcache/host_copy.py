"""Copies between the device KV pool (layer-major, by slot) and the host pool (token-major).

`copy_kv(pool, host, device_slots, host_slots, to_host=...)` moves the K and V of every
layer (and an FP8 pool's scale exponents) of n tokens in one direction. Both slot lists
are scattered: a radix-tree node's device slots are wherever the allocator found room,
and so are its host slots.

On CUDA one Triton kernel does each direction: program (t, b) moves one token's row of
one buffer (layer l's K or V, b = 2l + kv: num_kv_heads * head_dim elements, 2 KiB for
Llama-3-8B in bf16) between the device pool and the pinned host pool, which the kernel
addresses directly through unified virtual addressing. So a node's copy is one launch,
with no staging buffer and no host thread touching the bytes: the GPU's copy over PCIe
runs in stream order with the forwards, and a host-to-device copy's rows land where the
next forward reads them. The per-layer device buffers are separate tensors; the kernel
finds them through a table of their addresses (built once per pool).

Elsewhere (the CPU, the tests) the same copy is torch indexing, one layer at a time.
"""

from __future__ import annotations

import weakref

import torch

from radixmesh.worker.forward_batch import to_device
from radixmesh.worker.kvcache.host_pool import HostKVPool
from radixmesh.worker.kvcache.pool import KVPool

# Bytes moved as integers of the element's width (the kernel never does arithmetic on them).
_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
# Programs of the CUDA copy kernel for a reload (host_copy_kernel.py), which runs beside
# the forwards: few SMs, and still the link's rate (bench/host_kv.py, H200: 50.0-50.4 GB/s
# host to device from 16 programs to one per row, 2026-12-04). A copy out runs on the
# forwards' stream, between them, with one program per row.
LOAD_PROGRAMS = 32


def copy_kv(
    pool: KVPool,
    host: HostKVPool,
    device_slots: torch.Tensor,
    host_slots: torch.Tensor,
    *,
    to_host: bool,
    programs: int = 0,
) -> None:
    """Copy n tokens' KV (every layer) device -> host (`to_host`) or host -> device.

    `device_slots` [n] and `host_slots` [n] int64, on any device. Stream-ordered on CUDA:
    it returns before the copy runs, and later work on the stream sees it done; the
    kernel runs `programs` programs (0: one per row)."""
    n = device_slots.numel()
    if n != host_slots.numel():
        raise ValueError(f"host_slots: {host_slots.numel()} slots for {n} device slots")
    if n == 0:
        return
    if pool.device.type == "cuda" and host.pinned:
        _copy_cuda(pool, host, device_slots, host_slots, to_host, programs)
    else:
        _copy_torch(pool, host, device_slots, host_slots, to_host)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor as same-width integers (FP8 indexing is not covered on every device)."""
    return t.view(_AS_INT[t.element_size()])


def _copy_torch(
    pool: KVPool, host: HostKVPool, dev: torch.Tensor, hs: torch.Tensor, to_host: bool
) -> None:
    dev = dev.to(pool.device)
    hs = hs.cpu()
    data = _bytes(host.data)
    for layer in range(pool.num_layers):
        for kv, buffers in enumerate((pool.k_buffers, pool.v_buffers)):
            buf = _bytes(buffers[layer]).view(pool.num_slots, -1)
            if to_host:
                data[hs, layer, kv] = buf[dev].cpu()
            else:
                buf[dev] = data[hs, layer, kv].to(pool.device)
            if host.scales is not None:
                scales = (pool.k_scales, pool.v_scales)[kv][layer]
                if to_host:
                    host.scales[hs, layer, kv] = scales[dev].cpu()
                else:
                    scales[dev] = host.scales[hs, layer, kv].to(pool.device)


# ---- CUDA -----------------------------------------------------------------------------

# pool -> its address tables; weak: a closed pool's go with it (an id could be reused).
_TABLES: weakref.WeakKeyDictionary[KVPool, tuple[torch.Tensor, torch.Tensor | None]] = (
    weakref.WeakKeyDictionary()
)


def _tables(pool: KVPool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Device tables of the pool's buffer addresses: [2L] (K0, V0, K1, V1, ...) and the
    FP8 pool's scale buffers, the same order. Pool buffers never move once made."""
    cached = _TABLES.get(pool)
    if cached is not None:
        return cached
    ptrs = [b.data_ptr() for pair in zip(pool.k_buffers, pool.v_buffers, strict=True) for b in pair]
    table = torch.tensor(ptrs, dtype=torch.int64, device=pool.device)
    scales = None
    if pool.quantized:
        sp = [s.data_ptr() for pair in zip(pool.k_scales, pool.v_scales, strict=True) for s in pair]
        scales = torch.tensor(sp, dtype=torch.int64, device=pool.device)
    _TABLES[pool] = (table, scales)
    return table, scales


def _copy_cuda(
    pool: KVPool,
    host: HostKVPool,
    dev: torch.Tensor,
    hs: torch.Tensor,
    to_host: bool,
    programs: int,
) -> None:
    from radixmesh.worker.kvcache.host_copy_kernel import copy_rows

    dev = to_device(dev, pool.device)
    hs = to_device(hs, pool.device)
    table, scale_table = _tables(pool)
    int_dtype = _AS_INT[host.data.element_size()]
    copy_rows(table, _bytes(host.data), dev, hs, 2 * pool.num_layers, host.row, to_host, int_dtype)
    if scale_table is not None and host.scales is not None:
        heads = pool.num_kv_heads
        copy_rows(
            scale_table, host.scales, dev, hs, 2 * pool.num_layers, heads, to_host, torch.int8
        )
