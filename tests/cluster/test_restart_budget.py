"""The local launcher's restart budget is a rate: a router that dies again and again, each
time more than a window after its last restart, is restarted every time and the cluster
serves on (its worker untouched); deaths faster than the rate stop the cluster.

A real cluster (one dummy:tiny worker, one router) whose router processes are killed by
signal, supervised as `supervise` does it (`failure()` polled); a 1 s window keeps it short.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from radixmesh.cluster.child import RestartPolicy
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec

pytestmark = pytest.mark.slow

WINDOW = 1.0
MAX_RESTARTS = 2
DEATHS = 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    spec = LaunchSpec(
        model="dummy:tiny",
        workers=1,
        port=free_port(),
        worker_args=("--dtype", "float32"),
        router_options={"health_interval": 0.2},
        restart=RestartPolicy(
            max_restarts=MAX_RESTARTS,
            restart_backoff=0.05,
            max_restart_backoff=0.05,
            restart_window=WINDOW,
        ),
        ready_timeout=120.0,
    )
    with LocalCluster(spec) as c:
        yield c


def _kill_and_wait_for_the_restart(c: LocalCluster, sig: signal.Signals) -> str | None:
    """Kill the router's process; poll `failure()` until a new one runs (None) or the
    launcher gives up (its reason)."""
    old = c.router
    assert old is not None and old.poll() is None
    old.send_signal(sig)
    old.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (why := c.failure()) is not None:
            return why
        new = c.router
        if new is not None and new.pid != old.pid:
            return None
        time.sleep(0.02)
    raise AssertionError("the router was neither restarted nor given up on")


def test_deaths_spread_over_time_never_stop_the_cluster_a_crash_loop_does(
    cluster: LocalCluster,
) -> None:
    worker = cluster.workers[0]
    child = cluster.router_children[0]
    for i in range(DEATHS):
        sig = signal.SIGKILL if i % 2 else signal.SIGTERM
        assert _kill_and_wait_for_the_restart(cluster, sig) is None
        assert child.restarts == i + 1 and not child.gave_up
        time.sleep(WINDOW + 0.1)  # the last restart leaves the window
    assert cluster.failure() is None
    assert cluster.workers[0] is worker and worker.poll() is None  # untouched
    # A crash loop: the router dies at once after each restart, MAX_RESTARTS + 1 times
    # within the window. The third death finds two recent restarts: given up.
    results = [_kill_and_wait_for_the_restart(cluster, signal.SIGKILL) for _ in range(3)]
    assert results == [None, None, "every router exited for good"]
    assert child.restarts == DEATHS + MAX_RESTARTS and child.gave_up
    assert worker.poll() is None  # supervise stops it now (status 1); it was never at fault
