"""A launched worker's or router's tie to the local launcher that started it.

The local launcher (`radixmesh launch`, `Runtime`, `LocalCluster`) stops its workers and
routers on its way out. A launcher killed outright (SIGKILL, the kernel's OOM killer) has
no way out, and its children would serve on, orphaned, holding their ports, their memory
and their GPUs. So the launcher passes its process id in RADIXMESH_PARENT_PID, and a child
whose parent changes (it was re-parented to init or a subreaper) sends itself SIGTERM:
the drain an operator's SIGTERM gets.

Polling `getppid()` and not `prctl(PR_SET_PDEATHSIG)` (which the Ray launcher's actors
use for the process each one runs): the signal fires when the *thread* that forked the
child exits, and a local cluster may be started on any thread of a user's program (a
`Runtime`) and its children restarted from whichever thread supervises it; it also needs
a `preexec_fn`, which is unsafe in a process with threads.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from radixmesh.cluster.env import PARENT_PID_ENV


def watch_parent(interval: float = 1.0) -> threading.Thread | None:
    """Start a daemon thread that SIGTERMs this process once its launcher is gone.

    Only where RADIXMESH_PARENT_PID names this process's parent: the variable is taken out
    of the environment, so a process this one starts does not inherit the tie, and a
    process started some other way with the variable set (by hand, or inherited) is left
    alone. Returns the thread, or None when there is nothing to watch."""
    raw = os.environ.pop(PARENT_PID_ENV, None)
    if raw is None or not raw.isdigit() or int(raw) != os.getppid():
        return None
    parent = int(raw)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        print(
            f"radixmesh: the launcher (pid {parent}) is gone; stopping",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="radixmesh-parent-watch", daemon=True)
    thread.start()
    return thread
