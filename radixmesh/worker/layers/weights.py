"""How a parameter loads its slice of a full (unsharded) checkpoint tensor.

Every parameter of a TP-aware layer carries a `weight_loader(param, loaded, shard_id)`;
the model's `load_weights` looks it up here and never knows how the layer is sharded.
`shard_id` names the part of a fused parameter (q/k/v, gate/up) a checkpoint tensor fills.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

ShardId = int | str | None
WeightLoader = Callable[[nn.Parameter, torch.Tensor, ShardId], None]


def copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy src into dst (casting dtype), or a ValueError when the shapes differ."""
    if dst.shape != src.shape:
        raise ValueError(f"shape mismatch: expected {tuple(dst.shape)}, got {tuple(src.shape)}")
    dst.copy_(src)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId) -> None:
    if shard_id is not None:
        raise ValueError(f"unsharded parameter got shard {shard_id!r}")
    copy_checked(param.data, loaded)


def set_weight_loader(param: nn.Parameter, loader: WeightLoader) -> None:
    param.weight_loader = loader  # type: ignore[attr-defined]


def get_weight_loader(param: nn.Parameter) -> WeightLoader:
    loader: WeightLoader = getattr(param, "weight_loader", default_weight_loader)
    return loader


def new_parameter(
    *shape: int, dtype: torch.dtype | None, device: torch.device | str | None
) -> nn.Parameter:
    """An uninitialised inference-only parameter; `load_weights` fills every one of them."""
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
