"""Naming a worker to clients without disclosing it: by its cache-event epoch.

A resumable stream's id must let every router replica find the worker that holds the
request, yet a client must not learn which worker served it (worker ids and addresses are
the operator's business: `auth.Roles.operator`). The cache-event epoch does both: it is a
random number new for every worker process, and every replica's summary of the worker
carries the same one (router/pool.py keeps it in sync), so any replica maps it back to the
worker while the client sees 16 hex digits that say nothing of the cluster. Stored
Responses API ids name their worker the same way (responses_api/worker_store.py).

Read-only over the pool's public attributes: the pool stays the one owner of that state.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixmesh.router.pool import WorkerHandle, WorkerPool

UNKNOWN = 0  # the epoch of a worker this replica has not synced yet
_TOKEN = re.compile(r"[0-9a-f]{16}")


def epoch_of(pool: WorkerPool, worker_id: str) -> int:
    """The worker's epoch; UNKNOWN while this replica has not synced it."""
    handle = pool.workers.get(worker_id)
    return handle.summary.epoch if handle is not None else UNKNOWN


def token_of(pool: WorkerPool, worker_id: str) -> str:
    """The worker's epoch as 16 hex digits; all zeros while this replica does not know
    it (then a resume asks every worker: `holders`)."""
    return f"{epoch_of(pool, worker_id):016x}"


def is_token(token: str) -> bool:
    return _TOKEN.fullmatch(token) is not None


def holders(pool: WorkerPool, token: str) -> list[WorkerHandle]:
    """The workers that may hold what `token` names, most likely first: the worker of that
    epoch; else (this replica has not synced it yet, or the token was made before the
    naming replica had) the workers whose epoch this replica does not know; for the
    unknown token, every worker. A worker that does not hold the request says NotFound,
    so asking one too many costs a call, never a wrong answer."""
    epoch = int(token, 16)
    if epoch == UNKNOWN:
        return sorted(pool.workers.values(), key=lambda h: h.summary.epoch != UNKNOWN)
    return holders_of_epoch(pool, epoch)


def holders_of_epoch(pool: WorkerPool, epoch: int) -> list[WorkerHandle]:
    """The worker of a known `epoch`; else (not synced here yet) the workers whose epoch
    this replica does not know."""
    workers = list(pool.workers.values())
    named = [h for h in workers if h.summary.epoch == epoch]
    return named or [h for h in workers if h.summary.epoch == UNKNOWN]
