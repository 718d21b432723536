"""The KV pool: preallocated K and V tensors per layer, indexed by slot.

Slot 0 is reserved as a padding target (padded rows of a CUDA-graph batch write there)
and is never handed out by the allocator; `num_slots` counts it.

An FP8 pool (dtype float8_e4m3fn) also holds one int8 scale exponent per slot and KV
head for K and for V (`k_scales`, `v_scales`; the encoding is in fp8_kv.py); readers
dequantize with them.
"""

from __future__ import annotations

import torch

from radixmesh.worker.kvcache.fp8_kv import FP8, quantize_kv


def kv_storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """CacheConfig.kv_cache_dtype ("auto" | "fp8") -> the pool's storage dtype."""
    if kv_cache_dtype == "fp8":
        return FP8
    if kv_cache_dtype == "auto":
        return model_dtype
    raise ValueError(f"kv_cache_dtype: unknown {kv_cache_dtype!r}")


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
        self.quantized = dtype == FP8
        # [num_slots, num_kv_heads] int8 per layer: the FP8 pool's scale exponents
        self.k_scales: list[torch.Tensor] = []
        self.v_scales: list[torch.Tensor] = []
        if self.quantized:
            for scales in (self.k_scales, self.v_scales):
                scales.extend(
                    torch.zeros(shape[:2], dtype=torch.int8, device=self.device)
                    for _ in range(num_layers)
                )

    @staticmethod
    def bytes_per_slot(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """K and V of one token over every layer, scales included."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        per_head = head_dim * itemsize + (1 if dtype == FP8 else 0)
        return 2 * num_layers * num_kv_heads * per_head

    @property
    def nbytes(self) -> int:
        tensors = (*self.k_buffers, *self.v_buffers, *self.k_scales, *self.v_scales)
        return sum(t.numel() * t.element_size() for t in tensors)

    def scales(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """An FP8 pool's (k, v) scale exponents [num_slots, num_kv_heads] of one layer."""
        return (self.k_scales[layer_id], self.v_scales[layer_id]) if self.quantized else None

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k/v [T, num_kv_heads, head_dim] into slots `loc` [T] of one layer."""
        if self.quantized:  # written as bytes: indexing ops cover uint8 on every device
            k8, k_exp = quantize_kv(k)
            v8, v_exp = quantize_kv(v)
            self.k_buffers[layer_id].view(torch.uint8)[loc] = k8.view(torch.uint8)
            self.v_buffers[layer_id].view(torch.uint8)[loc] = v8.view(torch.uint8)
            self.k_scales[layer_id][loc] = k_exp
            self.v_scales[layer_id][loc] = v_exp
            return
        self.k_buffers[layer_id][loc] = k.to(self.dtype)
        self.v_buffers[layer_id][loc] = v.to(self.dtype)
