"""TPGroup: the optional fast all-reduce path and its fallback."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.layers.parallel import TPGroup


def test_fast_all_reduce_takes_what_it_accepts() -> None:
    seen: list[tuple[int, ...]] = []

    def fast(x: torch.Tensor) -> bool:
        seen.append(tuple(x.shape))
        if x.numel() > 4:
            return False  # too large: the group's collective (a no-op at size 1)
        x.mul_(2)  # stands for the sum over two ranks holding the same values
        return True

    tp = TPGroup(fast_all_reduce=fast)
    small = torch.ones(2, 2)
    assert tp.all_reduce(small) is small
    assert small.tolist() == [[2.0, 2.0], [2.0, 2.0]]
    big = torch.ones(3, 3)
    assert tp.all_reduce(big) is big
    assert big.sum().item() == 9.0  # untouched by the fast path
    assert seen == [(2, 2), (3, 3)]


def test_bad_rank_or_size() -> None:
    with pytest.raises(ValueError, match="size"):
        TPGroup(size=0)
    with pytest.raises(ValueError, match="rank"):
        TPGroup(rank=2, size=2)
