"""A process the local launcher keeps running: restarted when it dies, after a backoff
that doubles with each recent restart, while it has been restarted fewer than
`max_restarts` times in the last `restart_window` seconds.

The budget is a rate, not a count over the launcher's life: a router that dies now and then
over weeks (an operator's SIGTERM, an OOM kill) is restarted every time, while a crash
loop (deaths faster than the rate) is given up on. A lifetime count stopped the whole
cluster, healthy workers included, at the sixth death of one router however far apart the
deaths were. The backoff counts the same recent restarts, so after a quiet window it is
back to `restart_backoff`.

A child the launcher stops itself (`stop_restarting`, on its way out) is never restarted
and its exit counts for nothing. Any other exit counts, a clean one too: the launcher
cannot tell an operator's SIGTERM from a process that keeps exiting 0, and the window
makes occasional ones free.

One worker dying must not stop the cluster: the router sends its requests to the others
while it is down and takes it back once it answers again (a new process: the router
resyncs its cache summary from a snapshot).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument


@dataclass(frozen=True)
class RestartPolicy:
    """How the local launcher restarts a dead worker or router. Each field is a
    `radixmesh launch` flag of its name (launch_flags.py), hence the `restart_` in them."""

    max_restarts: int = 5
    """Restarts of each dead worker or router within any restart_window seconds; 0: never
    restart. A Ray launch takes it as ray_max_restarts when that is not given."""
    restart_backoff: float = 1.0
    """Seconds before a local child's restart, doubling with each recent one."""
    max_restart_backoff: float = 30.0
    """Seconds at most before a local child's restart (where the doubling stops)."""
    restart_window: float = 600.0
    """Seconds over which a local child's restarts count against max_restarts."""

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise InvalidArgument("max_restarts", f"must be >= 0, got {self.max_restarts}")
        if not 0 <= self.restart_backoff <= self.max_restart_backoff:
            raise InvalidArgument(
                "restart_backoff",
                f"must be in [0, {self.max_restart_backoff}], got {self.restart_backoff}",
            )
        if not self.restart_window > 0:
            raise InvalidArgument("restart_window", f"must be > 0, got {self.restart_window}")

    def delay(self, restarts: int) -> float:
        """Seconds before the next restart, after `restarts` recent ones."""
        return float(min(self.max_restart_backoff, self.restart_backoff * 2**restarts))


class Child:
    """`start()` launches the process; `tend()` restarts it when it died."""

    def __init__(
        self,
        name: str,
        launch: Callable[[], subprocess.Popen[bytes]],
        policy: RestartPolicy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.launch = launch
        self.policy = policy
        self.clock = clock
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0  # over its life (reported); the budget counts `recent`
        self.recent: deque[float] = deque()  # when each restart within the window was
        self.restart_at: float | None = None  # when the dead process is started again
        self.gave_up = False
        self.stopping = False  # the launcher is stopping it: no restart

    def start(self) -> None:
        self.proc = self.launch()

    def stop_restarting(self) -> None:
        """The launcher stops this child on purpose: its exit is not a death to restart."""
        self.stopping = True
        self.restart_at = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def dead(self) -> str | None:
        """'<name> (exit status N)' when its process has exited, else None."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"{self.name} (exit status {self.proc.returncode})"

    def tend(self) -> None:
        """Schedule a restart of a dead process, or do one that is due (say so on stderr)."""
        now = self.clock()
        if self.gave_up or self.stopping or self.proc is None or self.proc.poll() is None:
            return
        if self.restart_at is None:
            self._schedule(now, self.proc.returncode)
            return
        if now >= self.restart_at:
            self.restart_at = None
            self.restarts += 1
            self.recent.append(now)
            self.proc = self.launch()

    def _schedule(self, now: float, status: int) -> None:
        p = self.policy
        while self.recent and self.recent[0] <= now - p.restart_window:
            self.recent.popleft()
        if len(self.recent) >= p.max_restarts:
            self.gave_up = True
            _say(f"{self.name} exited (status {status}); restarted {len(self.recent)} times "
                 f"in the last {p.restart_window:g} s, not again")  # fmt: skip
            return
        delay = p.delay(len(self.recent))
        self.restart_at = now + delay
        _say(f"{self.name} exited (status {status}); restarting in {delay:g} s "
             f"({len(self.recent) + 1} of {p.max_restarts} in {p.restart_window:g} s)")  # fmt: skip


def _say(line: str) -> None:
    print(f"radixmesh: {line}", file=sys.stderr, flush=True)
