"""A launcher killed outright (SIGKILL, an OOM kill) takes its workers and router with it:
each sees its parent change and stops itself with the drain an operator's SIGTERM gets."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from radixmesh.cluster.env import PARENT_PID_ENV
from radixmesh.cluster.launch import free_port
from radixmesh.cluster.parent import watch_parent
from tests.cluster.processes import ready_line, refuses


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie waiting for a reaper has)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return re.search(r"^State:\s+Z", status, re.M) is None


def test_nothing_to_watch_without_the_launchers_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARENT_PID_ENV, raising=False)
    assert watch_parent() is None
    for value in ("not a pid", str(os.getpid())):  # not this process's parent: left alone
        monkeypatch.setenv(PARENT_PID_ENV, value)
        assert watch_parent() is None
        assert PARENT_PID_ENV not in os.environ  # taken out: its own children don't inherit it


def test_watching_the_parent_takes_the_variable_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PARENT_PID_ENV, str(os.getppid()))
    thread = watch_parent(interval=3600.0)  # sleeps out the session: no polling in the suite
    assert thread is not None and thread.daemon and thread.is_alive()
    assert PARENT_PID_ENV not in os.environ


@pytest.mark.slow
def test_a_sigkilled_launcher_takes_its_workers_and_router_with_it() -> None:
    if not Path("/proc/self/task").is_dir():
        pytest.fail("needs Linux's /proc")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixmesh.cluster.cli", "launch", "--model", "dummy:tiny",
         "--workers", "2", "--port", str(port), "--dtype", "float32"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    launched: list[int] = []
    try:
        ready = ready_line(proc, "radixmesh cluster ready")
        addresses = re.findall(r"127\.0\.0\.1:\d+", ready.split("workers", 1)[1])
        launched = [c.pid for c in psutil.Process(proc.pid).children()]
        assert len(launched) == 3  # two workers and the router
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 120
        while any(running(pid) for pid in launched) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in launched if running(pid)]
        assert all(refuses(a) for a in [f"127.0.0.1:{port}", *addresses])
    finally:
        for pid in [proc.pid, *launched]:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
