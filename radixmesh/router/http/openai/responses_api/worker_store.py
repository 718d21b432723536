"""The stored responses kept by the workers, so that every router replica finds them.

Why the workers: router replicas (`launch --routers N` sharing a port, Ray actors on
other nodes) have no memory in common, but every replica reaches every worker and knows
it by its cache-event epoch (random, new for every worker process, the same in every
replica's summary of it). So a response is stored on the worker that generated it, and
its id names that worker: `resp_<epoch, 16 hex digits><32 random hex digits>`. Any
replica reads the epoch back from the id, asks that worker (worker/stored_responses.py:
per caller, bounded by count and bytes, expiring), and needs nothing else: no shared
database to run, no replica-to-replica traffic, and a follow-up turn usually goes to the
same worker anyway (its prompt is that worker's cached prefix).

The cost of that choice: an entry lives as long as its worker process. A worker gone,
restarted (a new epoch) or not answering makes its entries unknown, which callers see as
any unknown id (a 404 naming it), never as a server error. A replica that has not yet
synced a worker's epoch asks every worker whose epoch it does not know.

Entries travel as JSON (`{"response": ..., "input_items": [...]}`), encoded and decoded
off the event loop; one over `max_entry_bytes` is not stored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from typing import TYPE_CHECKING

import grpc

from radixmesh.router.holders import epoch_of, holders_of_epoch
from radixmesh.router.http.openai.responses_api.store import (
    ResponseStore,
    StoredResponse,
)
from radixmesh.v1 import worker_pb2

if TYPE_CHECKING:
    from radixmesh.router.pool import WorkerHandle, WorkerPool

logger = logging.getLogger(__name__)

RPC_TIMEOUT = 5.0  # seconds for one store call on a worker
_ID = re.compile(r"resp_([0-9a-f]{16})[0-9a-f]{32}")


def response_id_on(epoch: int) -> str:
    """A new response id naming the worker of cache-event epoch `epoch`."""
    return f"resp_{epoch:016x}{uuid.uuid4().hex}"


def holder_epoch(response_id: str) -> int | None:
    """The epoch of the worker `response_id` names; None when it names none."""
    m = _ID.fullmatch(response_id)
    return None if m is None else int(m.group(1), 16)


class WorkerResponseStore(ResponseStore):
    """Entries on the workers of `pool` (module docstring), kept `ttl` seconds."""

    def __init__(self, pool: WorkerPool, ttl: float, max_entry_bytes: int) -> None:
        self.pool = pool
        self.ttl = ttl
        self.max_entry_bytes = max_entry_bytes

    def new_id(self, worker_id: str) -> str:
        # Epoch 0 (never synced) names no worker: such a response is answered, not stored.
        return response_id_on(epoch_of(self.pool, worker_id))

    async def put(self, caller: str, entry: StoredResponse) -> bool:
        epoch = holder_epoch(entry.id)
        holder = next((h for h in self.pool.workers.values() if h.summary.epoch == epoch), None)
        if not epoch or holder is None:
            return False
        blob = await asyncio.to_thread(_encode, entry)
        if len(blob) > self.max_entry_bytes:
            return False
        request = worker_pb2.PutStoredResponseRequest(
            caller=caller, response_id=entry.id, entry=blob, ttl_seconds=self.ttl
        )
        try:
            reply = await holder.stub.PutStoredResponse(
                request, timeout=RPC_TIMEOUT, metadata=holder.metadata
            )
        except grpc.aio.AioRpcError as e:
            logger.warning("storing a response on %s failed: %s", holder.worker_id, e.code().name)
            return False
        return bool(reply.stored)

    async def get(self, caller: str, response_id: str) -> StoredResponse | None:
        request = worker_pb2.GetStoredResponseRequest(caller=caller, response_id=response_id)
        for holder in self._holders(response_id):
            try:
                reply = await holder.stub.GetStoredResponse(
                    request, timeout=RPC_TIMEOUT, metadata=holder.metadata
                )
            except grpc.aio.AioRpcError as e:
                logger.info("stored response on %s: %s", holder.worker_id, e.code().name)
                continue
            if reply.found:
                return await asyncio.to_thread(_decode, reply.entry)
        return None

    async def delete(self, caller: str, response_id: str) -> bool:
        request = worker_pb2.DeleteStoredResponseRequest(caller=caller, response_id=response_id)
        for holder in self._holders(response_id):
            try:
                reply = await holder.stub.DeleteStoredResponse(
                    request, timeout=RPC_TIMEOUT, metadata=holder.metadata
                )
            except grpc.aio.AioRpcError as e:
                logger.info("stored response on %s: %s", holder.worker_id, e.code().name)
                continue
            if reply.deleted:
                return True
        return False

    def _holders(self, response_id: str) -> list[WorkerHandle]:
        """The worker the id names, else those whose epoch this replica does not know yet."""
        epoch = holder_epoch(response_id)
        return holders_of_epoch(self.pool, epoch) if epoch else []


def _encode(entry: StoredResponse) -> bytes:
    value = {"response": entry.response, "input_items": list(entry.input_items)}
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _decode(blob: bytes) -> StoredResponse:
    value = json.loads(blob)
    return StoredResponse(value["response"], tuple(value["input_items"]))
