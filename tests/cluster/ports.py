"""Free loopback ports for options that count up from a base port."""

from __future__ import annotations

import contextlib
import socket


def free_port_run(n: int, host: str = "127.0.0.1") -> int:
    """A port p with p .. p + n - 1 all free on `host` when checked (bound together, then
    released): for an option that takes a base port and counts up from it, as a router's
    metrics port does (the configured port plus its rank on the machine). `free_port` for
    the base alone leaves p + 1 to chance: on a machine full of Ray's connections an
    ephemeral port next to a free one was taken ("Address already in use")."""
    for _ in range(200):
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(socket.socket())
            first.bind((host, 0))
            base = int(first.getsockname()[1])
            if base + n - 1 > 65535:
                continue
            try:
                for port in range(base + 1, base + n):
                    stack.enter_context(socket.socket()).bind((host, port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no run of {n} free ports on {host} in 200 tries")
