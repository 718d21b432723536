"""Program-aware routing: which worker holds each program's shared prefix.

A client that knows a program's structure (the language's `fork`, `run_batch`) tags its
requests with a program id and the number of prompt tokens they share. The first request
of a program is placed by the policy; the program's later requests go to that worker
while it has fewer than `max_queued` requests running or queued, so the shared prefix
is prefilled once and read from one cache instead of being discovered request by request
(and copied onto every worker the policy spreads them to). Past that, or if the worker
is unhealthy or excluded (a retry), the policy places the request and the program moves
to the worker it chose. The table is bounded: the least recently used program goes.
"""

from __future__ import annotations

from collections import OrderedDict

from radixmesh.client.types import ProgramHint
from radixmesh.errors import InvalidArgument
from radixmesh.router.policy import Candidate

MAX_PROGRAMS = 65536
MAX_PROGRAM_ID = 128
__all__ = ["ProgramHint", "ProgramTable", "program_hint"]


def program_hint(program_id: str, shared_prefix_tokens: int) -> ProgramHint | None:
    """A request's program hint (None without an id); a client's id is bounded."""
    if not program_id:
        return None
    if len(program_id) > MAX_PROGRAM_ID:
        raise InvalidArgument("program_id", f"at most {MAX_PROGRAM_ID} characters")
    return ProgramHint(program_id, shared_prefix_tokens)


class ProgramTable:
    def __init__(self, max_queued: int, capacity: int = MAX_PROGRAMS) -> None:
        self.max_queued = max_queued
        self.capacity = capacity
        self._home: OrderedDict[str, str] = OrderedDict()  # program id -> worker id
        self.kept = 0  # requests sent to their program's worker

    def home(self, hint: ProgramHint | None, candidates: list[Candidate]) -> str | None:
        """The worker to keep this request on, or None (let the policy choose)."""
        if hint is None or hint.shared_prefix_tokens <= 0:
            return None
        worker = self._home.get(hint.program_id)
        if worker is None:
            return None
        self._home.move_to_end(hint.program_id)
        for c in candidates:
            if c.worker_id == worker:
                if c.healthy and c.queued < self.max_queued:
                    self.kept += 1
                    return worker
                return None
        return None

    def placed(self, hint: ProgramHint | None, worker_id: str) -> None:
        """The policy placed a request of this program on `worker_id`."""
        if hint is None or hint.shared_prefix_tokens <= 0:
            return
        self._home[hint.program_id] = worker_id
        self._home.move_to_end(hint.program_id)
        while len(self._home) > self.capacity:
            self._home.popitem(last=False)

    def __len__(self) -> int:
        return len(self._home)
