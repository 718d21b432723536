from __future__ import annotations

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.config import RouterConfig


def test_host_hit_cost_is_checked() -> None:
    assert RouterConfig(workers=("a:1",)).host_hit_cost == 0.2
    assert RouterConfig(workers=("a:1",), host_hit_cost=1.0).host_hit_cost == 1.0
    for bad in (-0.5, 1.01, float("nan")):
        with pytest.raises(InvalidArgument, match=r"host_hit_cost: must be in \[0, 1\], got"):
            RouterConfig(workers=("a:1",), host_hit_cost=bad)
