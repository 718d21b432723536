"""How a parameter loads its slice of a full (unsharded) checkpoint tensor.

Every parameter of a TP-aware layer carries a `weight_loader(param, loaded, shard_id)`;
the model's `load_weights` looks it up here and never knows how the layer is sharded.
`shard_id` names the part of a fused parameter (q/k/v, gate/up) a checkpoint tensor fills.

A loader may hand a `LazySlice` instead of a tensor (safetensors under tensor
parallelism): sharded layers `narrow` it, so each rank reads only its own slice from disk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

# A fused parameter's piece: q/k/v by name, gate/up by index, an expert's (expert, piece).
ShardId = int | str | tuple[int, int] | None


class LazySlice:
    """A checkpoint tensor not read yet: `shape`, and `narrow` reading only that part.

    `source` is a safetensors slice handle (`safe_open(...).get_slice(name)`), valid while
    its file is open; results are cast to `dtype` on `device`.
    """

    def __init__(self, source: Any, *, dtype: torch.dtype, device: torch.device | str) -> None:
        self.source = source
        self.shape = tuple(int(n) for n in source.get_shape())
        self.dtype = dtype
        self.device = device

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = tuple([slice(None)] * dim + [slice(start, start + length)])
        part: torch.Tensor = self.source[index]
        return part.to(device=self.device, dtype=self.dtype)

    def full(self) -> torch.Tensor:
        return self.narrow(0, 0, self.shape[0]) if self.shape else self.source[:]


Loaded = torch.Tensor | LazySlice
WeightLoader = Callable[[nn.Parameter, Loaded, ShardId], None]


def as_tensor(loaded: Loaded) -> torch.Tensor:
    return loaded.full() if isinstance(loaded, LazySlice) else loaded


def copy_checked(dst: torch.Tensor, src: Loaded) -> None:
    """Copy src into dst (casting dtype), or a ValueError when the shapes differ."""
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"shape mismatch: expected {tuple(dst.shape)}, got {tuple(src.shape)}")
    dst.copy_(as_tensor(src))


def default_weight_loader(param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
    if shard_id is not None:
        raise ValueError(f"unsharded parameter got shard {shard_id!r}")
    copy_checked(param.data, loaded)


def set_weight_loader(param: nn.Parameter, loader: WeightLoader) -> None:
    param.weight_loader = loader  # type: ignore[attr-defined]


def get_weight_loader(param: nn.Parameter) -> WeightLoader:
    loader: WeightLoader = getattr(param, "weight_loader", default_weight_loader)
    return loader


def mark_optional(param: nn.Parameter) -> None:
    """A parameter that a checkpoint may carry but need not: its layer fills it while
    loading another tensor (a quantization scale computed from a full-precision weight)."""
    param.optional_in_checkpoint = True  # type: ignore[attr-defined]


def is_optional(param: nn.Parameter) -> bool:
    return bool(getattr(param, "optional_in_checkpoint", False))


def new_parameter(
    *shape: int, dtype: torch.dtype | None, device: torch.device | str | None
) -> nn.Parameter:
    """An uninitialised inference-only parameter; `load_weights` fills every one of them."""
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
