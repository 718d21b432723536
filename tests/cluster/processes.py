"""Helpers for tests that run `radixmesh launch` as a child process."""

from __future__ import annotations

import socket
import subprocess
import time


def ready_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 120.0) -> str:
    """Read the child's stdout until the line starting with `prefix` (failing if the child
    exits or `timeout` seconds pass first) and return it."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = ""
    while not line.startswith(prefix):
        assert time.monotonic() < deadline and proc.poll() is None
        line = proc.stdout.readline()
    return line


def refuses(address: str) -> bool:
    """Whether nothing listens on `host:port` any more."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return False
    except OSError:
        return True
