"""require_deterministic: the router admits only workers that report deterministic mode.

Two real `radixmesh worker` processes on loopback (dummy:tiny), one with --deterministic;
the router's pool polls both over gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixmesh.client import Client
from radixmesh.cluster.launch import free_port
from radixmesh.router.config import RouterConfig
from radixmesh.router.pool import WorkerPool


def _worker(log: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "radixmesh.cluster.cli", "worker", "--model", "dummy:tiny"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--kv-cache-tokens", "2048", *flags]
    return subprocess.Popen(
        cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT
    ), f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(address of a deterministic worker, address of a default one)."""
    logs = tmp_path_factory.mktemp("workers")
    names = ["det.log", "default.log"]
    procs = [_worker(logs / names[0], "--deterministic"), _worker(logs / names[1])]
    try:
        for (proc, address), name in zip(procs, names, strict=True):
            with Client(address) as c:
                deadline = time.monotonic() + 120
                while not c.health():
                    assert proc.poll() is None, (logs / name).read_text()
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
        yield procs[0][1], procs[1][1]
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait(timeout=30)


def _poll(config: RouterConfig) -> list[tuple[bool, bool]]:
    """(healthy, refused) of each worker after one health poll."""

    async def run() -> list[tuple[bool, bool]]:
        pool = WorkerPool(config)
        try:
            handles = list(pool.workers.values())
            return [(await h.poll(), h.refused) for h in handles]
        finally:
            await pool.close()

    return asyncio.run(run())


def test_a_worker_without_deterministic_mode_is_refused(
    workers: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="radixmesh.router.pool")
    got = _poll(RouterConfig(workers=workers, require_deterministic=True))
    assert got == [(True, False), (False, True)]
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1
    assert workers[1] in refusals[0] and "--deterministic" in refusals[0]


def test_without_the_requirement_both_are_admitted(workers: tuple[str, str]) -> None:
    assert _poll(RouterConfig(workers=workers)) == [(True, False), (True, False)]
