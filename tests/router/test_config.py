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


def test_a_port_serves_one_protocol() -> None:
    """gRPC and the HTTP listener both set SO_REUSEPORT, so one port for both would bind
    and split connections between them: refused, naming the field."""
    with pytest.raises(InvalidArgument, match="http_port: 7000 is also the port; give another"):
        RouterConfig(workers=("a:1",), port=7000, http_port=7000)
    with pytest.raises(InvalidArgument, match="metrics_port: 7001 is also the http_port"):
        RouterConfig(workers=("a:1",), port=7000, http_port=7001, metrics_port=7001)
    assert RouterConfig(workers=("a:1",), port=0, http_port=0, metrics_port=0).http_port == 0
    assert RouterConfig(workers=("a:1",), port=7000, http_port=7001).http_port == 7001
