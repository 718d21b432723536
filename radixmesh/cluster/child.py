"""A process the local launcher keeps running: restarted when it dies, after a backoff
that doubles with each restart, until it has been restarted `max_restarts` times.

One worker dying must not stop the cluster: the router sends its requests to the others
while it is down and takes it back once it answers again (a new process: the router
resyncs its cache summary from a snapshot).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5  # per child, over the launcher's life; 0: never restart
    backoff: float = 1.0  # seconds before the first restart, doubling for each next one
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise InvalidArgument("max_restarts", f"must be >= 0, got {self.max_restarts}")
        if not 0 <= self.backoff <= self.max_backoff:
            raise InvalidArgument(
                "restart_backoff", f"must be in [0, {self.max_backoff}], got {self.backoff}"
            )

    def delay(self, restarts: int) -> float:
        """Seconds before restart number `restarts + 1`."""
        return float(min(self.max_backoff, self.backoff * 2**restarts))


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
        self.restarts = 0
        self.restart_at: float | None = None  # when the dead process is started again
        self.gave_up = False

    def start(self) -> None:
        self.proc = self.launch()

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
        if self.gave_up or self.proc is None or self.proc.poll() is None:
            return
        if self.restart_at is None:
            status = self.proc.returncode
            if self.restarts >= self.policy.max_restarts:
                self.gave_up = True
                _say(f"{self.name} exited (status {status}); restarted {self.restarts} times, "
                     "not again")  # fmt: skip
                return
            delay = self.policy.delay(self.restarts)
            self.restart_at = now + delay
            _say(f"{self.name} exited (status {status}); restarting in {delay:g} s "
                 f"({self.restarts + 1} of {self.policy.max_restarts})")  # fmt: skip
            return
        if now >= self.restart_at:
            self.restart_at = None
            self.restarts += 1
            self.proc = self.launch()


def _say(line: str) -> None:
    print(f"radixmesh: {line}", file=sys.stderr, flush=True)
