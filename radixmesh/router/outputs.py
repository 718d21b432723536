"""Worker outputs on the router: each request's `Sink`, filled from its worker's output
stream or from the request's own Generate call, and watched for stalls and shutdown.

The data path of one token: the worker's scheduler step produces it, the worker's output
stream (worker/output_stream.py) sends it in that step's batch for every request this
router placed there, `OutputReader` (one per worker, on the router's loop) puts it in the
request's sink, and the request's handler takes everything its sink holds at once (several
chunks joined into one while the client is slower than the worker) and forwards it. The
router so reads one message per worker and step, not one per request and token, and
writes fewer, larger messages to a client that falls behind.

A request whose worker has no output stream open (not yet connected, a worker that does
not offer one) gets its chunks on its own Generate call, into the same sink.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Protocol

import grpc

from radixmesh.errors import Unavailable
from radixmesh.v1 import common_pb2, worker_pb2

logger = logging.getLogger(__name__)


class WorkerStalled(Unavailable):
    """A worker sent nothing (no chunk, no output batch, no health answer) for
    `stall_timeout` seconds while a request waited on it (hung)."""


class Heard(Protocol):
    worker_id: str
    last_heard: float  # time.monotonic() of the worker's last message of any kind


class Sink:
    """One request's chunks as they arrive, and how its worker call ended if it failed.
    Owned by the router's event loop."""

    __slots__ = (
        "_waiter",
        "call_ended",
        "chunks",
        "error",
        "finished",
        "stream_id",
        "touched",
        "worker",
    )

    def __init__(self, worker: Heard, stream_id: str | None) -> None:
        self.worker = worker
        self.stream_id = stream_id  # the worker's output stream it named (None: its call)
        self.chunks: list[common_pb2.GenerateChunk] = []
        self.error: BaseException | None = None
        self.touched = time.monotonic()
        self.finished = False  # the request's finishing chunk came
        # When the worker's Generate call ended well (time.monotonic()); None while open.
        self.call_ended: float | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put(self, chunk: common_pb2.GenerateChunk) -> None:
        self.chunks.append(chunk)
        self.touched = time.monotonic()
        self.finished = self.finished or chunk.HasField("finish")
        self._wake()

    def fail(self, error: BaseException) -> None:
        """End the request with `error` after the chunks already here (the first error
        stays)."""
        if self.error is None:
            self.error = error
        self._wake()

    async def get(self) -> list[common_pb2.GenerateChunk]:
        """Every chunk here (waits for one); the failure once none is left."""
        while not self.chunks:
            if self.error is not None:
                raise self.error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks, self.chunks = self.chunks, []
        return chunks

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)


class SinkWatch:
    """The sinks of the requests in flight: a sink whose worker went silent for
    `stall_timeout` seconds fails with WorkerStalled (a hung worker, e.g. SIGSTOPped,
    must not hold its callers for minutes); `stop` fails them all at once when the router
    shuts down. One sweep over them every quarter of the timeout, instead of a timer per
    read."""

    def __init__(self, stall_timeout: float) -> None:
        self.stall_timeout = stall_timeout
        self.stopping: str | None = None  # why the sinks were stopped (shutdown)
        self._sinks: set[Sink] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def add(self, sink: Sink) -> None:
        if self.stopping is not None:
            raise Unavailable(self.stopping)
        self._sinks.add(sink)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def discard(self, sink: Sink) -> None:
        self._sinks.discard(sink)

    def stop(self, why: str) -> None:
        """Fail every sink now (and refuse new ones) with Unavailable(why)."""
        self.stopping = why
        for sink in self._sinks:
            sink.fail(Unavailable(why))

    async def _sweep(self) -> None:
        interval = min(self.stall_timeout / 4, 1.0)
        while self._sinks:
            await asyncio.sleep(interval)
            self.sweep(time.monotonic())

    def sweep(self, now: float) -> None:
        """Fail the sinks whose worker said nothing since `now` - stall_timeout, and those
        whose worker call ended well that long ago without the request's finish (a finish
        on the output stream trails its call's end by milliseconds; one that never comes
        would hold the caller until its deadline while the worker answers health checks).
        The error goes to the caller and does not name the worker (only an operator learns
        which worker served a request): the log does."""
        for sink in list(self._sinks):
            if now - max(sink.touched, sink.worker.last_heard) > self.stall_timeout:
                logger.warning(
                    "worker %s sent nothing for %g s: its request fails",
                    sink.worker.worker_id,
                    self.stall_timeout,
                )
                sink.fail(WorkerStalled(f"the worker sent nothing for {self.stall_timeout:g} s"))
            elif (
                sink.call_ended is not None
                and not sink.finished
                and now - max(sink.call_ended, sink.touched) > self.stall_timeout
            ):
                logger.warning(
                    "worker %s ended a request's call without its finish: it fails",
                    sink.worker.worker_id,
                )
                sink.fail(WorkerStalled("the worker's call ended without the request's finish"))


class OutputReader:
    """One worker's output stream, read into the sinks of this router's requests there.
    `stream_id` names it while it is open (None: requests get their chunks on their own
    calls); reopened under a new name after it ends."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker  # the WorkerHandle: its stub, metadata, last_heard
        self.stream_id: str | None = None
        self.sinks: dict[str, Sink] = {}  # worker request id -> its sink

    async def run(self, retry_interval: float) -> None:
        while True:
            try:
                await self._follow()
            except grpc.aio.AioRpcError as e:
                logger.debug("outputs of %s: %s", self.worker.worker_id, e.code().name)
            await asyncio.sleep(retry_interval)

    async def _follow(self) -> None:
        name = uuid.uuid4().hex
        call = self.worker.stub.StreamOutputs(
            worker_pb2.StreamOutputsRequest(stream_id=name), metadata=self.worker.metadata
        )
        try:
            await call.initial_metadata()  # the worker has registered the name
            self.stream_id = name
            sinks = self.sinks
            async for batch in call:
                self.worker.last_heard = time.monotonic()
                for chunk in batch.chunks:
                    sink = sinks.get(chunk.request_id)
                    if sink is not None:
                        sink.put(chunk)
        finally:
            self.stream_id = None
            call.cancel()
            self._lost(name)

    def _lost(self, name: str) -> None:
        """The stream ended: requests that named it may have lost their last chunks (their
        error does not name the worker: the caller's; the log does)."""
        lost = [s for s in self.sinks.values() if s.stream_id == name]
        if lost:
            logger.info(
                "worker %s: its output stream ended under %d requests",
                self.worker.worker_id,
                len(lost),
            )
        for sink in lost:
            sink.fail(WorkerStalled("the worker's output stream ended"))


async def pump_call(call: Any, sink: Sink) -> None:
    """A worker Generate call's chunks (when it sends them on the call) and its failure
    into the request's sink; a call that ends well adds nothing but the time it ended
    (its finish came, on the call or on the output stream; `SinkWatch` fails the sink if
    it never does)."""
    try:
        async for resp in call:
            sink.put(resp.chunk)
            sink.worker.last_heard = sink.touched
    except grpc.aio.AioRpcError as e:
        sink.fail(e)
    else:
        sink.call_ended = time.monotonic()


class Joined:
    """A worker's streamed chunks as one chunk: repeated fields (token ids, logprobs)
    concatenated, counts and the finish from the last chunk."""

    def __init__(self) -> None:
        self._chunk = common_pb2.GenerateChunk()
        self._text: list[str] = []

    @classmethod
    def of(cls, chunks: list[common_pb2.GenerateChunk]) -> common_pb2.GenerateChunk:
        joined = cls()
        for c in chunks:
            joined.add(c)
        return joined.chunk()

    def add(self, chunk: common_pb2.GenerateChunk) -> None:
        self._text.append(chunk.text)
        self._chunk.MergeFrom(chunk)  # appends repeated fields, overwrites set scalars

    def chunk(self) -> common_pb2.GenerateChunk:
        self._chunk.text = "".join(self._text)
        return self._chunk
