"""The connection limits' pieces that need no server (radixmesh/listener.py): the keyless
limits' validation, the per-address strikes, the listen backlog."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixmesh import listener
from radixmesh.errors import InvalidArgument
from radixmesh.listener import ListenerLimits, Strikes, listen_backlog


def test_keyless_limits_are_validated_by_name() -> None:
    for field, value in (
        ("keyless_connections", 0), ("keyless_per_peer", 0), ("auth_failures", 0),
        ("auth_window", 0.0), ("auth_window", float("nan")),
    ):  # fmt: skip
        with pytest.raises(InvalidArgument) as e:
            ListenerLimits(**{field: value})  # type: ignore[arg-type]
        assert e.value.field == field


def test_an_address_with_too_many_closes_in_its_window_is_blocked_until_it_ends() -> None:
    strikes = Strikes(limit=3, window=10.0)
    for now in (100.0, 101.0):
        strikes.add("a", now)
    strikes.add("b", 101.0)
    assert not strikes.blocked("a", 102.0)
    strikes.add("a", 102.0)
    assert strikes.blocked("a", 102.0) and strikes.blocked("a", 109.9)
    assert not strikes.blocked("a", 110.0)  # the window from the first close ended
    assert not strikes.blocked("b", 102.0) and not strikes.blocked("c", 102.0)
    strikes.add("a", 110.0)  # a new window
    assert strikes.peers["a"] == [110.0, 1.0]


def test_strikes_forget_ended_windows_then_the_oldest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listener, "MAX_STRUCK_PEERS", 4)
    strikes = Strikes(limit=1, window=10.0)
    for i, now in enumerate((0.0, 1.0, 12.0, 13.0)):
        strikes.add(f"p{i}", now)
    strikes.add("p4", 14.0)  # full: p0 and p1's windows ended
    assert list(strikes.peers) == ["p2", "p3", "p4"]
    strikes.add("p5", 15.0)
    strikes.add("p6", 16.0)  # full, none ended: the oldest go, down to half
    assert list(strikes.peers) == ["p4", "p5", "p6"]


def test_the_backlog_is_the_kernels_ceiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "somaxconn"
    monkeypatch.setattr(listener, "SOMAXCONN_PATH", str(path))
    assert listen_backlog() == 4096  # unreadable: a common kernel's default
    for value, backlog in (("64\n", 128), ("4096\n", 4096), ("1000000\n", 65535)):
        path.write_text(value)
        assert listen_backlog() == backlog
