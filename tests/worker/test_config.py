"""Batch sizes left unset are filled in for the device (worker/config.py)."""

from __future__ import annotations

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.worker.config import SchedulerConfig, batch_defaults, fit_running_to_pool
from radixmesh.worker.engine import Engine

GIB = 1 << 30


def test_cpu_defaults() -> None:
    sc = batch_defaults(SchedulerConfig(), "cpu")
    assert (sc.max_running_requests, sc.max_num_batched_tokens) == (64, 2048)


def test_cuda_defaults_follow_the_gpu() -> None:
    big = batch_defaults(SchedulerConfig(), "cuda", 141 * GIB)
    assert (big.max_running_requests, big.max_num_batched_tokens) == (256, 8192)
    small = batch_defaults(SchedulerConfig(), "cuda", 24 * GIB)
    assert (small.max_running_requests, small.max_num_batched_tokens) == (256, 4096)


def test_cuda_running_cap_follows_the_pool() -> None:
    sc = batch_defaults(SchedulerConfig(), "cuda", 141 * GIB)
    assert fit_running_to_pool(sc, 897_413).max_running_requests == 256
    assert fit_running_to_pool(sc, 64_000).max_running_requests == 125  # 64,000 / 512
    assert fit_running_to_pool(sc, 1_000).max_running_requests == 16  # the floor


def test_overlap_is_on_for_cuda_only_unless_given() -> None:
    assert batch_defaults(SchedulerConfig(), "cpu").overlap_schedule is False
    assert batch_defaults(SchedulerConfig(), "cuda", 141 * GIB).overlap_schedule is True
    on = SchedulerConfig(overlap_schedule=True)
    assert batch_defaults(on, "cpu").overlap_schedule is True


def test_given_sizes_are_kept() -> None:
    sc = SchedulerConfig(max_running_requests=8, max_num_batched_tokens=100, overlap_schedule=False)
    assert batch_defaults(sc, "cuda", 141 * GIB) == sc
    with pytest.raises(InvalidArgument, match="max_running_requests"):
        SchedulerConfig(max_running_requests=0)


def test_the_engine_reports_its_resolved_sizes() -> None:
    with Engine("dummy:tiny", device="cpu") as engine:
        sc = engine.config.scheduler
        assert (sc.max_running_requests, sc.max_num_batched_tokens) == (64, 2048)
        assert sc.overlap_schedule is False
        assert engine.worker.req_table.num_free_rows == 64
