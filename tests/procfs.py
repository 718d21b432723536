"""Reading a live process's children from Linux's /proc, for tests that check what a
process started and what it left behind."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """The direct children of `pid`: the union of every thread's list (a process started from
    a helper thread is listed under that thread only). A thread can exit between the listing
    of /proc/PID/task and the read of its file; it then has no children to report."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found
