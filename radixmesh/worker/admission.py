"""The engine's bounded queue: how many requests it holds, and those still compiling.

A request is counted from its submission until its last output or its abort, whichever
comes first (an aborted request leaves at the next step boundary: its place is free for
the next request at once): at most `capacity` (max_running_requests +
max_queued_requests) at once; one more is `Overloaded`, which the worker's server answers
as RESOURCE_EXHAUSTED and the router retries on another worker. Score's continuations
count one each.

A request whose constraint compiles waits here, outside the scheduler, with no thread
waiting for it: an abort that arrives meanwhile takes it out, and it ends as aborted
the moment its compile settles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from radixmesh.errors import Overloaded
from radixmesh.worker.request import Request
from radixmesh.worker.request_output import RequestOutput


class Admission:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._outstanding = 0
        self._counted: set[str] = set()  # request ids that hold a place
        self._compiling: dict[str, Request] = {}
        self._lock = threading.Lock()

    @property
    def outstanding(self) -> int:
        """Requests submitted and not finished yet."""
        return self._outstanding

    def check(self, n: int) -> None:
        """Overloaded when n requests could never fit at once."""
        if n > self.capacity:
            raise Overloaded(f"{n} requests in one call; the worker queues at most {self.capacity}")

    def reserve(self, n: int) -> None:
        """Count n more requests in, or Overloaded when there is no room for them."""
        with self._lock:
            if self._outstanding + n > self.capacity:
                raise Overloaded(
                    f"the worker's queue is full ({self._outstanding} requests, "
                    f"at most {self.capacity})"
                )
            self._outstanding += n

    def release(self, n: int) -> None:
        with self._lock:
            self._outstanding -= n

    def counted(
        self, rid: str, sink: Callable[[RequestOutput], None]
    ) -> Callable[[RequestOutput], None]:
        """`sink` of a reserved request `rid`, releasing its place with its last output
        (unless `leave(rid)` did before)."""
        with self._lock:
            self._counted.add(rid)

        def counted(out: RequestOutput) -> None:
            if out.finished:
                self.leave(rid)
            sink(out)

        return counted

    def leave(self, rid: str) -> None:
        """Request `rid` gives its place back (once: later calls do nothing)."""
        with self._lock:
            if rid in self._counted:
                self._counted.discard(rid)
                self._outstanding -= 1

    def hold(self, req: Request) -> None:
        """`req` waits for its compile."""
        with self._lock:
            self._compiling[req.rid] = req

    def take(self, rid: str) -> Request | None:
        """The request `rid` if it still waits for its compile (it no longer does)."""
        with self._lock:
            return self._compiling.pop(rid, None)
