"""The connection limits' pieces that need no server (radixmesh/listener.py): the keyless
limits' validation, the per-address strikes and probation, the listen backlog."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixmesh import listener
from radixmesh.errors import InvalidArgument
from radixmesh.listener import (
    PROBATION_GRACE,
    PROBATION_PER_PEER,
    PROBATION_WINDOW,
    STRUCK,
    KeylessConnections,
    ListenerLimits,
    Strikes,
    listen_backlog,
)


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


class Held:
    """A keyless connection for `KeylessConnections`: shedding forgets it, as the gate's
    and the HTTP listener's do."""

    def __init__(self, peer: str, held: KeylessConnections[Held]) -> None:
        self.peer, self.held = peer, held
        self.shed_for: str | None = None

    def shed(self, reason: str) -> None:
        self.shed_for = reason
        self.held.forget(self)
        self.held.closed(self, 0.0)


def test_a_struck_address_gets_a_few_short_lived_connections_not_none() -> None:
    held: KeylessConnections[Held] = KeylessConnections(
        ListenerLimits(keyless_connections=20, keyless_per_peer=2, auth_window=10.0)
    )
    keyless = (10.0, "closed at auth_window without a key")
    a = [Held("a", held) for _ in range(4)]
    assert [held.hold(c, 0.0) for c in a] == [keyless] * 4
    # a[2] and a[3] each evicted the oldest: 2 closes, so "a" is struck.
    assert [c.shed_for for c in a] == ["evicted over keyless_per_peer"] * 2 + [None, None]
    assert held.strikes.blocked("a", 0.0) and not held.strikes.blocked("b", 0.0)
    probation = [Held("a", held) for _ in range(PROBATION_PER_PEER)]
    assert [held.hold(c, 0.1 * i) for i, c in enumerate(probation)] == [
        (PROBATION_WINDOW, STRUCK)
    ] * PROBATION_PER_PEER
    # Every place taken: a newer one is refused while the oldest is younger than the
    # grace, then takes its place; the address's connections from before it was struck
    # are not touched.
    assert held.refuses("a", PROBATION_GRACE - 0.01) and not held.refuses("b", 0.0)
    assert not held.refuses("a", PROBATION_GRACE)
    late = Held("a", held)
    assert held.hold(late, PROBATION_GRACE) == (PROBATION_WINDOW, STRUCK)
    assert [c.shed_for for c in probation] == [STRUCK] + [None] * (PROBATION_PER_PEER - 1)
    assert [c.shed_for for c in a[2:]] == [None, None]
    assert (len(held), len(held.by_peer["a"]), len(held.on_probation["a"])) == (10, 2, 8)
    # The oldest place is now probation[1]'s, taken at 0.1.
    assert held.refuses("a", 0.1 + PROBATION_GRACE - 0.01)
    # Once the window of strikes ends, the address is not refused, nor held on probation.
    assert not held.refuses("a", 10.0) and held.hold(Held("a", held), 10.0) == keyless
    b = Held("b", held)
    assert held.hold(b, 0.0) == keyless
    for c in list(held):
        held.forget(c)
    assert (len(held), held.by_peer, held.on_probation) == (0, {}, {})
