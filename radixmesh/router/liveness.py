"""Whether a worker is up, busy or down: the router's liveness rule, and how soon a
client refused for want of a worker may try again.

A health poll (GetLoad) that fails does not by itself say the worker is gone. On a loaded
machine a worker's answer can take longer than `health_timeout` while the worker streams
tokens to this router every step: marking it down then refused every request with "no
healthy worker" although both workers were serving (an operator's 3,000-request burst on
2 cores: 1,398 requests answered 503). So the router judges a failed poll by how it failed
and by the worker's last word on any channel (`WorkerHandle.last_heard`: output batches,
chunks on Generate calls, cache events, and load reports as of the engine's last read):

- refused or dropped (UNAVAILABLE, and any status a server chose: unauthenticated,
  internal, ...): down at once. A dead process refuses connections immediately; a worker
  that says it cannot serve (loading, shut down) means it.
- too slow (DEADLINE_EXCEEDED, or RESOURCE_EXHAUSTED: gRPC's queue of calls is full, so
  the server is there): busy while the worker said something within `liveness_window`
  seconds — it keeps its state, and its breaker counts nothing; down once it has been
  silent on every channel for that long (hung: SIGSTOP, a stuck device).
- answered: up (unless draining), and the report's load age (how long ago the worker's
  engine last answered, worker/load_report.py) is the engine's last word: a worker whose
  server answers while its engine has said nothing for `liveness_window` is down too.

The window trades a hung worker's extra routing time against a busy worker's longest
silence: it must outlast the longest scheduler step on a loaded machine (a large prefill
chunk on a CPU), and stay well under `stream_stall_timeout`, so that new requests stop
going to a hung worker long before the ones waiting there are given up.
"""

from __future__ import annotations

from typing import Literal

import grpc

Verdict = Literal["up", "busy", "down"]

# Statuses that mean the answer did not come in time, not that the server said no.
SLOW = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED})

# Seconds a client refused with UNAVAILABLE / 503 for want of a worker (none healthy, the
# router still starting or shutting down) is told to wait (gRPC retry-after metadata, HTTP
# Retry-After). The router re-probes a down worker every half second (pool.py), so one
# that is back is routable within a second of it; how long a worker takes to come back is
# unknown to the router, and a refusal costs it next to nothing, so the shortest useful wait
# is the right one. HTTP counts whole seconds: 1 s is also the shortest it can say, and gRPC
# says the same so that both front ends behave alike.
UNAVAILABLE_RETRY_AFTER = 1.0


def judge(failure: grpc.StatusCode | None, silent_for: float, window: float) -> Verdict:
    """The worker's state after a health poll: `failure` is the poll's status (None: it
    answered), `silent_for` the seconds since the worker's last word on any channel (the
    answer's own word included), `window` the router's `liveness_window`."""
    if failure is not None and failure not in SLOW:
        return "down"
    if silent_for <= window:
        return "busy" if failure is not None else "up"
    return "down"
