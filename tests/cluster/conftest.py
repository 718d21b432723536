"""The Ray tests take this machine's Ray in turn.

`make test` runs two test modules at a time. Two Ray clusters side by side do not stay
apart: a bare `ray.init()` or `--ray-address auto` joins whichever cluster it finds on the
machine, and on two cores each starves the other's actors past their ready timeouts. A
module that starts Ray holds an exclusive lock on one file for as long as its cluster
lives; the other process's Ray module waits for it (its other modules do not).

Ray runs its worker processes, our actors among them, at niceness 15 (RAY_worker_niceness)
so that its own daemons come first. Beside any process at the default priority (two busy
loops, here) the actors then get next to no CPU, and a cluster that is ready in 20 s was
not ready in 300. A serving cluster sets it to 0 (deploy/ray/), and so do these tests.

Ray's memory monitor is off here (RAY_memory_monitor_refresh_ms=0): it reads the whole
machine's memory as its node's, so the other test process's servers counted against
this module's actors: it killed a router actor at start during a full run."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

LOCK = Path(tempfile.gettempdir()) / "radixmesh-tests-ray.lock"


@pytest.fixture(scope="module")
def ray_turn() -> Iterator[None]:
    """This module's turn with Ray: held from its cluster's start to its shutdown, with the
    actors at the default priority."""
    with LOCK.open("w") as f, pytest.MonkeyPatch.context() as env:
        fcntl.flock(f, fcntl.LOCK_EX)
        env.setenv("RAY_worker_niceness", "0")
        env.setenv("RAY_memory_monitor_refresh_ms", "0")
        yield
