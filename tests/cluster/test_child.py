"""The launcher's restarts (cluster/child.py): a dead child comes back after a backoff that
doubles, while it was restarted fewer than `max_restarts` times within the window; a live
one is left alone, one the launcher stops is not restarted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from radixmesh.cluster.child import Child, RestartPolicy
from radixmesh.errors import InvalidArgument


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _exits() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])


def test_restarts_with_doubling_backoff_then_gives_up(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    launches: list[subprocess.Popen[bytes]] = []

    def launch() -> subprocess.Popen[bytes]:
        launches.append(_exits())
        return launches[-1]

    child = Child("worker 0", launch, RestartPolicy(max_restarts=2, restart_backoff=1.0), clock)
    child.start()
    delays = []
    while not child.gave_up:
        assert child.proc is not None
        child.proc.wait()
        child.tend()  # schedules the restart, or gives up
        if child.gave_up:
            break
        assert child.restart_at is not None
        delays.append(child.restart_at - clock.now)
        clock.now = child.restart_at - 0.01
        child.tend()
        assert len(launches) == child.restarts + 1  # not due yet
        clock.now = child.restart_at
        child.tend()
    assert delays == [1.0, 2.0]
    assert (len(launches), child.restarts, child.dead()) == (3, 2, "worker 0 (exit status 3)")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "radixmesh: worker 0 exited (status 3); restarting in 1 s (1 of 2 in 600 s)",
        "radixmesh: worker 0 exited (status 3); restarting in 2 s (2 of 2 in 600 s)",
        "radixmesh: worker 0 exited (status 3); restarted 2 times in the last 600 s, not again",
    ]


def test_a_live_child_is_left_alone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        child = Child("the router", lambda: proc, RestartPolicy(), Clock())
        child.start()
        child.tend()
        assert child.alive and child.restart_at is None and child.dead() is None
    finally:
        proc.kill()
        proc.wait()


def test_policy_checks_and_caps_its_backoff() -> None:
    policy = RestartPolicy(restart_backoff=4.0, max_restart_backoff=10.0)
    assert [policy.delay(n) for n in range(4)] == [4.0, 8.0, 10.0, 10.0]
    with pytest.raises(InvalidArgument, match="max_restarts: must be >= 0"):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(InvalidArgument, match="restart_window: must be > 0"):
        RestartPolicy(restart_window=0.0)


def _die_and_restart(child: Child, clock: Clock) -> float | None:
    """Let the child's process die and tend it: the restart's delay, or None (gave up)."""
    assert child.proc is not None
    child.proc.wait()
    child.tend()
    if child.gave_up:
        return None
    assert child.restart_at is not None
    delay = child.restart_at - clock.now
    clock.now = child.restart_at
    child.tend()
    return delay


def test_deaths_spread_beyond_the_window_are_restarted_every_time() -> None:
    """Ten deaths, each more than a window after the restart before: none gives up, and
    the backoff never grows (no restart is recent)."""
    clock = Clock()
    child = Child("the router", _exits, RestartPolicy(max_restarts=3, restart_window=60.0), clock)
    child.start()
    delays = []
    for _ in range(10):
        delays.append(_die_and_restart(child, clock))
        clock.now += 60.5
    assert delays == [1.0] * 10
    assert (child.restarts, child.gave_up) == (10, False)


def test_a_crash_loop_is_given_up_on_and_old_restarts_expire() -> None:
    clock = Clock()
    child = Child("the router", _exits, RestartPolicy(max_restarts=3, restart_window=60.0), clock)
    child.start()
    # Two restarts, then a quiet window: they expire, and three more fit.
    assert [_die_and_restart(child, clock) for _ in range(2)] == [1.0, 2.0]
    clock.now += 60.0
    assert [_die_and_restart(child, clock) for _ in range(4)] == [1.0, 2.0, 4.0, None]
    assert (child.restarts, child.gave_up) == (5, True)


def test_a_child_the_launcher_stops_is_not_restarted() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    child = Child("worker 0", lambda: proc, RestartPolicy(), Clock())
    child.start()
    child.stop_restarting()
    proc.terminate()
    proc.wait()
    child.tend()
    assert (child.restart_at, child.restarts, child.gave_up) == (None, 0, False)
