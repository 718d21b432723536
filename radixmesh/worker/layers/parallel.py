"""The tensor-parallel group a layer belongs to, passed to every TP-aware layer explicitly.

Layers shard their weights by `rank`/`size` and call the collectives below; nothing reads
a global. With `size == 1` every collective is a no-op, so CPU runs need no process group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    group: Any = None  # torch.distributed.ProcessGroup; None: the default group
    # Optional faster path for small all-reduces (tp/one_shot.py): called with the tensor,
    # returns True when it has summed it in place, False to leave it to the group.
    fast_all_reduce: Callable[[torch.Tensor], bool] | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size: must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank: must be in [0, {self.size}), got {self.rank}")

    def divide(self, n: int, what: str) -> int:
        """`n / size`, or a ValueError naming `what` when it does not split evenly."""
        if n % self.size:
            raise ValueError(f"{what}: {n} is not divisible by the TP size {self.size}")
        return n // self.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the group, in place."""
        if self.fast_all_reduce is not None and self.fast_all_reduce(x):
            return x
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(x, group=self.group)
        return x

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite every rank's `x` with rank `src`'s, in place."""
        if self.size > 1:
            import torch.distributed as dist

            dist.broadcast(x, src=src, group=self.group)
        return x

    def min_over_ranks(self, n: int, device: torch.device) -> int:
        """The smallest of every rank's `n` (ranks must agree on sizes, e.g. the KV pool)."""
        if self.size == 1:
            return n
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's `x` along `dim`, in rank order."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)


SINGLE = TPGroup()
