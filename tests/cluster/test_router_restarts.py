"""A router SIGTERMed again and again under steady load loses nothing.

A call that reaches a router in the instant its server starts shutting down is answered
CANCELLED by grpc-core, not UNAVAILABLE; the SDK must take that as the router going away
and fail over. Before it did, about one SIGTERM in four lost a request here.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from radixmesh.cluster.child import RestartPolicy
from tests.cluster.test_faults import (
    LOSS_BOUND_S,
    Cluster,
    Load,
    _wait_all_healthy,
    launched_cluster,
)

pytestmark = pytest.mark.slow

ROUNDS = 8


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    policy = RestartPolicy(max_restarts=ROUNDS, restart_backoff=0.2, max_restart_backoff=0.4)
    with launched_cluster(policy) as c:
        yield c


def test_a_router_sigtermed_repeatedly_loses_nothing(cluster: Cluster) -> None:
    served = 0
    for _ in range(ROUNDS):
        router = cluster.launched.router
        assert router is not None
        with Load(cluster.target, bound_s=LOSS_BOUND_S) as load:
            time.sleep(0.5)  # streams in flight through both routers
            router.send_signal(signal.SIGTERM)
            time.sleep(1.0)  # new calls arrive while it drains and after it is gone
        served += load.check()[0]  # none lost, errors only Unavailable
        _wait_all_healthy(cluster)
        assert cluster.launched.router is not None
        assert cluster.launched.router.pid != router.pid  # restarted by the launcher
    print(f"{ROUNDS} router SIGTERMs under load: {served} finished, 0 lost")
