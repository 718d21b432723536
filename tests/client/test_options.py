"""The SDK's channel target (options.channel_target): one address as it is, several
routers as one static list gRPC fails over in."""

from __future__ import annotations

import pytest

from radixmesh.client.options import channel_target
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
