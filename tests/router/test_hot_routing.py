"""Hot-prefix replication in the router (`--hot-prefix-replication`): the control plane's
picks, fed its own routing decisions and the workers' ended requests on an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.prefix import block_hashes
from radixmesh.router.config import RouterConfig
from radixmesh.router.control import ControlPlane
from radixmesh.router.metrics import RouterMetrics
from radixmesh.router.pool import LoadReport, WorkerPool
from radixmesh.v1 import worker_pb2

BLOCK = 4
PROMPT = list(range(100, 116))  # four blocks: one prefix (key_blocks 4)
HASHES = block_hashes(PROMPT, BLOCK)
WORKERS = ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _with_control(test: Callable[[ControlPlane, Clock], Any], **config: Any) -> Any:
    """Run `test` on a control plane of three reachable workers: worker-0 caches the prompt
    and is idle, worker-1 runs one request, worker-2 two (so every choice is exact)."""

    async def run() -> Any:
        clock = Clock()
        pool = WorkerPool(RouterConfig(workers=WORKERS, seed=0, **config), clock=clock)
        for i, w in enumerate(pool.workers.values()):
            w.reachable = True  # as after a health answer
            w.block_size = BLOCK  # as after its snapshot
            w.load = LoadReport(num_running=i)
        pool.workers["worker-0"].summary.store(HASHES)
        try:
            return test(ControlPlane(pool.config, pool, RouterMetrics(pool)), clock)
        finally:
            await pool.close()

    return asyncio.run(run())


def _measure(control: ControlPlane, clock: Clock) -> None:
    """worker-0 finishes 11 of the router's requests over 0..1 s: a capacity of 10 a second."""
    w = control.pool.workers["worker-0"]
    load = w.load
    for i in range(11):
        clock.now = i / 10
        w.request_started(0)
        w.request_ended()
    w.load, w.ended_since_poll = load, 0  # (as after the next poll)


def _metrics(control: ControlPlane) -> list[float | None]:
    get = control.metrics.registry.get_sample_value
    return [
        get("radixmesh_router_hot_prefixes"),
        get("radixmesh_router_hot_prefix_homes_added_total"),
        get("radixmesh_router_hot_prefix_homes_removed_total"),
    ]


def _pick(control: ControlPlane, clock: Clock, t: float) -> str:
    clock.now = t
    return control.pick(PROMPT, set()).worker.worker_id


def test_a_hot_prefix_gets_a_home_where_a_copy_is_cheaper_then_none() -> None:
    def test(control: ControlPlane, clock: Clock) -> list[Any]:
        _measure(control, clock)
        hot = control.pool.hot
        assert hot is not None and hot.capacity_rps == 10.0
        # 20 requests a second: hot past 0.8 x 10 a second (the 9th), with worker-0, which
        # caches the prompt and is idle, its first home; it takes every request.
        peak = [_pick(control, clock, 1.0 + i / 20) for i in range(1, 11)]
        first = list(hot.homes(HASHES[3]))
        # worker-0 runs 2 (cost 128): worker-1 costs half the 16 tokens it lacks + 64 for
        # its one running request (72), worker-2 136: worker-1 becomes a home.
        control.pool.workers["worker-0"].load = LoadReport(num_running=2)
        second = _pick(control, clock, 1.55)
        homes = [list(hot.homes(HASHES[3])), _metrics(control)]
        # A home counts as caching the prompt (its summary does not yet): worker-1, 64.
        again = _pick(control, clock, 1.6)
        control.pool.workers["worker-0"].load = LoadReport()
        # 1 a second: below 0.5 x 10 for the one home left, the prefix is not hot.
        cool = [_pick(control, clock, t) for t in (3.0, 3.5)]
        return [peak, first, second, *homes, again, cool, hot.homes(HASHES[3]), _metrics(control)]

    w0, w1 = "worker-0", "worker-1"
    assert _with_control(test, hot_prefix_replication=True) == [
        [w0] * 10,
        [w0],
        w1,
        [w0, w1],
        [1.0, 1.0, 0.0],
        w1,
        [w0, w0],
        [],
        [0.0, 1.0, 1.0],
    ]


def test_off_by_default_the_prefix_stays_on_its_worker() -> None:
    def test(control: ControlPlane, clock: Clock) -> list[Any]:
        _measure(control, clock)
        picks = {_pick(control, clock, 1.0 + i / 20) for i in range(1, 21)}
        return [control.pool.hot, picks, _metrics(control)]

    assert _with_control(test) == [None, {"worker-0"}, [0.0, 0.0, 0.0]]


def test_another_replicas_ended_request_counts_toward_capacity() -> None:
    def test(control: ControlPlane, clock: Clock) -> float:
        w = control.pool.workers["worker-1"]
        for seq in range(1, 12):
            clock.now = (seq - 1) / 10
            w.others[f"r{seq}"] = 0  # (its pending event came)
            w.summary.sequence = seq - 1
            w.apply(
                worker_pb2.CacheEvent(
                    kind=worker_pb2.CACHE_EVENT_KIND_REQUEST_ENDED,
                    sequence=seq,
                    request_id=f"r{seq}",
                )
            )
        assert control.pool.hot is not None
        return control.pool.hot.capacity_rps

    assert _with_control(test, hot_prefix_replication=True) == 10.0


def test_a_removed_worker_is_no_home() -> None:
    def test(control: ControlPlane, clock: Clock) -> list[Any]:
        _measure(control, clock)
        for i in range(1, 10):
            _pick(control, clock, 1.0 + i / 20)
        control.pool.workers["worker-0"].load = LoadReport(num_running=2)
        _pick(control, clock, 1.5)  # (worker-1: a second home, as above)
        hot = control.pool.hot
        assert hot is not None
        before = list(hot.homes(HASHES[3]))
        control.pool.remove_worker("worker-1")
        return [before, hot.homes(HASHES[3]), _metrics(control)]

    assert _with_control(test, hot_prefix_replication=True) == [
        ["worker-0", "worker-1"],
        [],
        [0.0, 1.0, 0.0],
    ]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"hot_prefix_replication": True, "policy": "round_robin"}, "hot_prefix_replication"),
        ({"hot_prefix_window": 0.0}, "hot_prefix_window"),
        ({"hot_prefix_shrink_utilization": 0.9}, "hot_prefix_shrink_utilization"),
        ({"hot_prefix_max_homes": 0}, "hot_prefix_max_homes"),
        ({"hot_prefix_key_blocks": 0}, "hot_prefix_key_blocks"),
    ],
)
def test_bad_settings_are_refused_by_their_flags_names(config: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        RouterConfig(workers=WORKERS, **config)
    assert e.value.field == field
