"""The control plane's one call: `pick(ids, exclude, hint) -> Placement`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from radixmesh.errors import Unavailable
from radixmesh.prefix import block_hashes
from radixmesh.router.config import RouterConfig
from radixmesh.router.control import ControlPlane
from radixmesh.router.metrics import RouterMetrics
from radixmesh.router.pool import WorkerPool
from radixmesh.router.programs import ProgramHint

BLOCK = 4
PROMPT = list(range(100, 116))  # four blocks
HASHES = block_hashes(PROMPT, BLOCK)


def _with_control(test: Callable[[ControlPlane], Any], **config: Any) -> Any:
    """Run `test` on a control plane of two reachable workers (the pool's channels need
    a running loop)."""

    async def run() -> Any:
        pool = WorkerPool(RouterConfig(workers=("127.0.0.1:1", "127.0.0.1:2"), **config))
        for w in pool.workers.values():
            w.reachable = True  # as after a health answer
            w.block_size = BLOCK  # as after its snapshot
        try:
            return test(ControlPlane(pool.config, pool, RouterMetrics(pool)))
        finally:
            await pool.close()

    return asyncio.run(run())


def test_pick_goes_where_the_prompt_is_cached_and_says_how_much() -> None:
    def test(control: ControlPlane) -> tuple[str, int]:
        control.pool.workers["worker-1"].summary.store(HASHES[:3])
        worker, cached = control.pick(PROMPT, set())
        return worker.worker_id, cached

    assert _with_control(test) == ("worker-1", 12)


def test_pick_never_returns_an_excluded_worker_and_fails_when_all_are() -> None:
    def test(control: ControlPlane) -> tuple[str, int]:
        control.pool.workers["worker-1"].summary.store(HASHES)
        worker, cached = control.pick(PROMPT, {"worker-1"})
        with pytest.raises(Unavailable):
            control.pick(PROMPT, {"worker-0", "worker-1"})
        return worker.worker_id, cached

    assert _with_control(test) == ("worker-0", 0)


def test_a_picked_prompt_is_tentatively_cached_on_its_worker() -> None:
    def test(control: ControlPlane) -> list[Any]:
        first = control.pick(PROMPT, set())
        other = next(w for w in control.pool.workers.values() if w is not first.worker)
        seen = [first.cached, first.worker.summary.match(HASHES), other.summary.match(HASHES)]
        # The same prompt follows it before the worker has reported a block.
        second = control.pick(PROMPT, set())
        return [*seen, second.worker is first.worker, second.cached]

    assert _with_control(test) == [0, 4, 0, True, 16]


def test_a_program_stays_with_its_worker() -> None:
    def test(control: ControlPlane) -> set[str]:
        hint = ProgramHint("p", 8)
        return {
            control.pick(list(range(i, i + 16)), set(), hint).worker.worker_id for i in range(4)
        }

    assert len(_with_control(test, policy="round_robin")) == 1


def test_pick_weighs_host_memory_hits_and_counts_them() -> None:
    def test(control: ControlPlane) -> list[Any]:
        w0, w1 = control.pool.workers["worker-0"], control.pool.workers["worker-1"]
        w0.summary.store(HASHES[:1])  # worker-0: one block on its device
        w1.summary.store(HASHES)
        w1.summary.offload(HASHES[1:])  # worker-1: one on the device, three in host memory
        # Costs: worker-0 16 - 4 = 12; worker-1 16 - 4 - 12 + 0.2 x 12 = 2.4.
        placed = control.pick(PROMPT, set())
        metric = "radixmesh_router_host_cached_prompt_tokens_total"
        first = [
            placed.worker.worker_id,
            placed.cached,
            control.metrics.registry.get_sample_value(metric),
        ]
        # Excluded, worker-1's host hits are not counted for a prompt worker-0 takes.
        other = control.pick(PROMPT, {"worker-1"})
        return [*first, other.worker.worker_id, control.metrics.registry.get_sample_value(metric)]

    # Placement.cached: its device and host tokens (16: none left to prefill there).
    assert _with_control(test) == ["worker-1", 16, 12.0, "worker-0", 12.0]
