"""The SDK's channel target and arguments (options.channel_target, channel_options): one
address as it is with pick_first, several routers as one static list under round_robin,
several connections each with their own subchannel pool."""

from __future__ import annotations

import json

import pytest

from radixmesh.client.options import (
    CHANNEL_OPTIONS,
    ROUND_ROBIN,
    ClientOptions,
    channel_options,
    channel_target,
)
from radixmesh.errors import InvalidArgument


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("127.0.0.1:50050", "127.0.0.1:50050"),
        ("router.example:443", "router.example:443"),
        ("dns:///routers:50050", "dns:///routers:50050"),
        ("127.0.0.1:1,127.0.0.2:2", "ipv4:127.0.0.1:1,127.0.0.2:2"),
        (" 127.0.0.1:1 , 127.0.0.3:2", "ipv4:127.0.0.1:1,127.0.0.3:2"),
        ("[::1]:1,[::1]:2", "ipv6:[::1]:1,[::1]:2"),
    ],
)
def test_targets(target: str, expected: str) -> None:
    assert channel_target(target) == expected


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("127.0.0.1:1,127.0.0.1", "'127.0.0.1' is not host:port"),
        ("127.0.0.1:1,:2", "':2' is not host:port"),
        ("127.0.0.1:1,127.0.0.1:x", "'127.0.0.1:x' is not host:port"),
        ("127.0.0.1:1,[::1]:2", "give addresses of one family (IPv4 or IPv6)"),
    ],
)
def test_bad_lists_name_the_target(target: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        channel_target(target)
    assert (e.value.field, e.value.message) == ("target", message)


LOCAL_POOL = ("grpc.use_local_subchannel_pool", 1)
BALANCE = ("grpc.service_config", ROUND_ROBIN)


@pytest.mark.parametrize(
    ("target", "connections", "added"),
    [
        ("127.0.0.1:50050", 1, []),
        ("dns:///routers:50050", 1, []),
        ("ipv4:127.0.0.1:1", 1, []),
        ("127.0.0.1:50050", 4, [LOCAL_POOL]),
        ("ipv4:127.0.0.1:1,127.0.0.2:2", 1, [BALANCE]),
        ("ipv6:[::1]:1,[::1]:2", 2, [BALANCE, LOCAL_POOL]),
    ],
)
def test_channel_options(target: str, connections: int, added: list[tuple[str, object]]) -> None:
    assert channel_options(target, connections) == [*CHANNEL_OPTIONS, *added]


def test_round_robin_is_grpcs_own_balancer() -> None:
    assert json.loads(ROUND_ROBIN) == {"loadBalancingConfig": [{"round_robin": {}}]}


def test_connections_below_one_name_the_field() -> None:
    with pytest.raises(InvalidArgument) as e:
        ClientOptions(connections=0)
    assert (e.value.field, e.value.message) == ("connections", "must be >= 1, got 0")
