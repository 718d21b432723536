"""The generation path both front ends share: admit, pick a worker, proxy its chunks.

A front end (the gRPC service, the HTTP API) hands over a tokenized prompt and its caller;
the dispatcher admits it (admission.py), asks the control plane for a worker (`pick`,
the one call into routing), sends the worker token ids under an id of the router's own,
and yields the worker's chunks under the caller's id. A worker that fails before the
first chunk reaches the client (UNAVAILABLE, or overloaded: RESOURCE_EXHAUSTED with
retry-after metadata) is left for another, up to `max_attempts` workers; once a chunk has
been forwarded, a failure ends the stream with the worker's status.

A resumable stream (the caller passes a `StreamRef`) is started on its worker as one
that outlives its call: if this router dies, the worker holds it for a grace period and
`resume` continues it through any router (worker/resumable.py). Its id is the worker's
cache-event epoch (holders.py: every replica maps it back to the worker, a client learns
nothing of the cluster from it) and the worker's request id, a random 128-bit name; the
worker lets only the same caller (auth.caller_of its key) resume it. A caller that goes
away from a live router ends it here with an Abort, as a plain stream's cancelled call
ends it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from radixmesh.client import convert
from radixmesh.errors import InvalidArgument, NotFound, Overloaded, RadixMeshError, Unavailable
from radixmesh.router.admission import Admission, RateLimiter
from radixmesh.router.config import RouterConfig
from radixmesh.router.control import Placement
from radixmesh.router.holders import holders, is_token, token_of
from radixmesh.router.metrics import RouterMetrics
from radixmesh.router.outputs import Joined, Sink, SinkWatch, WorkerStalled, pump_call
from radixmesh.router.pool import WorkerHandle, WorkerPool
from radixmesh.router.programs import ProgramHint
from radixmesh.sampling_params import SamplingParams
from radixmesh.tokenizer import TokenizerLike
from radixmesh.v1 import common_pb2, worker_pb2
from radixmesh.wire import grammar_key_of, input_ids_from_proto, params_from_proto

logger = logging.getLogger(__name__)


class Picker(Protocol):
    """What the dispatcher uses of the control plane (control.py)."""

    tokenizer: TokenizerLike | None  # None while the router is starting
    model_info: common_pb2.ModelInfo | None
    pool: WorkerPool  # the workers by id (a resumed stream names its worker)

    def pick(
        self,
        ids: list[int],
        exclude: set[str],
        hint: ProgramHint | None = None,
        grammar: int | None = None,
    ) -> Placement: ...


def retryable(e: grpc.aio.AioRpcError) -> bool:
    """Whether another worker may serve a request that failed so before its first chunk:
    the worker was gone or going, or overloaded (never a message over gRPC's size limits,
    also RESOURCE_EXHAUSTED, which every worker would refuse)."""
    return convert.server_went_away(e) or convert.is_overloaded(e)


@dataclass
class StreamRef:
    """A resumable stream's id, filled in once its worker is chosen: "<the worker's epoch,
    16 hex digits>/<the worker's request id, 32 hex digits>" (holders.py: the epoch lets
    any replica find the worker without naming it to the client). Front ends send it with
    each message, with the completion tokens delivered so far (the offset to resume at).
    `worker_rid` is known before the worker is: a front end names the stream's reply
    after it (event_ids.derived_id), and so does any replica that resumes it."""

    stream_id: str = ""
    worker_rid: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def resumed(cls, stream_id: str, field: str) -> StreamRef:
        """The ref of a stream to resume; InvalidArgument naming `field` for no stream id."""
        return cls(stream_id, cls.parse(stream_id, field)[1])

    @staticmethod
    def parse(stream_id: str, field: str) -> tuple[str, str]:
        """(worker token, worker request id) of a stream id; InvalidArgument naming
        `field`."""
        token, _, wrid = stream_id.rpartition("/")
        hexes = all(c in "0123456789abcdef" for c in wrid)
        if not is_token(token) or len(wrid) != 32 or not hexes:
            raise InvalidArgument(field, f"not a stream id: {stream_id[:128]!r}")
        return token, wrid


class Dispatcher:
    def __init__(self, config: RouterConfig, picker: Picker, metrics: RouterMetrics) -> None:
        self.config = config
        self.picker = picker
        self.metrics = metrics
        # (caller, request id) -> the worker serving it and the id it has there: a caller
        # reaches only its own requests (auth.caller_of), and ids never collide on a worker.
        self.requests: dict[tuple[str, str], tuple[WorkerHandle, str]] = {}
        self.retries = 0
        self.admission = Admission(
            config.max_concurrent_requests, config.max_queued_requests, config.queue_timeout
        )
        self.rate = RateLimiter(
            config.rate_limit, config.rate_burst or math.ceil(config.rate_limit)
        )
        self.metrics.watch_admission(self.admission, self.rate)
        self.streams = SinkWatch(config.stream_stall_timeout)
        self._aborts: set[asyncio.Task[bool]] = set()  # Aborts of resumable streams left

    async def input_ids(self, inp: common_pb2.Input) -> list[int]:
        """The prompt's token ids; text is tokenized on a thread (a long prompt must not
        stall the loop), after its size is checked."""
        tok = self.picker.tokenizer
        if tok is None:
            raise Unavailable("the router is still starting")
        c = self.config
        info = self.picker.model_info
        max_ids = min(c.max_prompt_tokens, info.context_length if info else c.max_prompt_tokens)
        read = functools.partial(
            input_ids_from_proto,
            inp,
            tok,
            max_text_bytes=c.max_prompt_bytes,
            max_messages=c.max_messages,
            max_token_ids=max_ids,
        )
        if inp.WhichOneof("kind") == "token_ids":
            return read()
        return await asyncio.to_thread(read)

    def _claim(self, key: tuple[str, str]) -> None:
        if key in self.requests:
            rid = key[1]
            raise InvalidArgument("request_id", f"request {rid[:128]!r} is already in flight")

    # ---- generate -----------------------------------------------------------------------

    async def route_and_stream(
        self,
        ids: list[int],
        params: common_pb2.SamplingParams,
        rid: str,
        *,
        stream: bool,
        hint: ProgramHint | None = None,
        caller: str = "",
        resumable: StreamRef | None = None,
    ) -> AsyncGenerator[tuple[str, common_pb2.GenerateChunk], None]:
        """Route a tokenized prompt; yield (worker id, chunk) as the worker streams them.
        With `resumable` (a stream), the worker holds the request for a resume should
        this router die; `resumable.stream_id` names it once a worker was chosen.
        `rid` is the caller's id for it (`caller`: auth.caller_of its key); the worker gets
        an id of the router's own.

        Raises a `RadixMeshError` when no worker can be chosen, or the worker's
        `grpc.aio.AioRpcError` (after retries on other workers while nothing was yielded).
        Closing the generator early (a client that went away) cancels the worker's call,
        which aborts the request there.

        The worker's first chunk tells the router that the prefill is done (cache_aware's
        pending-prefill term stops counting the request then). For a client that asked
        for no stream, the worker sends just that chunk and then the rest joined
        (`first_and_rest`), which are joined into one here: two messages a request, not
        one a token.
        """
        self._check_against_the_model(ids, params)
        key = (caller, rid)
        self._claim(key)
        wreq = worker_pb2.GenerateRequest(
            input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=ids)),
            sampling_params=params,
            request_id=uuid.uuid4().hex if resumable is None else resumable.worker_rid,
            stream=stream,
            first_and_rest=not stream,
            resumable=resumable is not None,
            owner=caller,
        )
        tried: set[str] = set()
        last_error: grpc.aio.AioRpcError | WorkerStalled | None = None
        t0 = time.perf_counter()  # for the router-side latency histograms
        async with self.admission.slot():  # before routing: a refusal leaves no load behind
            while len(tried) < self.config.max_attempts:
                try:
                    worker, cached = self.picker.pick(ids, tried, hint, grammar_key_of(params))
                except RadixMeshError:
                    if last_error is not None:
                        break
                    raise
                tried.add(worker.worker_id)
                if resumable is not None:
                    token = token_of(self.picker.pool, worker.worker_id)
                    resumable.stream_id = f"{token}/{wreq.request_id}"
                attempt = _Attempt(worker, pending=len(ids) - cached, started_at=t0)
                try:
                    async with aclosing(self._stream_from(attempt, wreq, key, stream)) as chunks:
                        async for chunk in chunks:
                            yield worker.worker_id, chunk
                    return
                except (grpc.aio.AioRpcError, WorkerStalled) as e:
                    self._failed(worker, e, give_up=attempt.forwarded)
                    last_error = e
            assert last_error is not None
            raise last_error

    async def resume(
        self, stream_id: str, offset: int, caller: str = "", field: str = "stream_id"
    ) -> AsyncGenerator[tuple[str, common_pb2.GenerateChunk], None]:
        """A resumable stream's chunks after its first `offset` completion tokens, from
        the worker holding it, under the stream id as request id. NotFound when that
        worker does not hold it for this caller (finished and gone, the grace passed, or
        another caller's); InvalidArgument naming `field` for an id that is none.

        The id's epoch names one worker; where this replica cannot tell which (holders.py),
        each candidate is asked in turn until one holds the stream: the others answer
        NOT_FOUND before any chunk. The error of the last asked is raised, unless an earlier
        one failed otherwise (it may have been the holder: its error says more)."""
        token, wrid = StreamRef.parse(stream_id, field)
        candidates = holders(self.picker.pool, token)
        if not candidates:
            raise NotFound(f"no stream {stream_id[:128]!r}: its worker is not known here")
        key = (caller, stream_id)
        self._claim(key)
        wreq = worker_pb2.GenerateRequest(
            request_id=uuid.uuid4().hex,
            stream=True,
            resumable=True,
            owner=caller,
            resume_from=worker_pb2.ResumeFrom(request_id=wrid, offset=offset),
        )
        failed: tuple[WorkerHandle, grpc.aio.AioRpcError | WorkerStalled] | None = None
        async with self.admission.slot():
            for i, worker in enumerate(candidates):
                attempt = _Attempt(worker, pending=0, started_at=time.perf_counter())
                try:
                    async with aclosing(self._stream_from(attempt, wreq, key, True)) as chunks:
                        async for chunk in chunks:
                            yield worker.worker_id, chunk
                    return
                except (grpc.aio.AioRpcError, WorkerStalled) as e:
                    if failed is None or _not_found(failed[1]) or attempt.forwarded:
                        failed = (worker, e)
                    if attempt.forwarded or i == len(candidates) - 1:
                        self._failed(*failed, give_up=True)

    def _check_against_the_model(self, ids: list[int], params: common_pb2.SamplingParams) -> None:
        """The workers' checks against the model, made here first: a prompt past the context
        is refused before it is hashed, routed and sent (a 4 MiB one took 0.25 s of the
        event loop that way)."""
        info = self.picker.model_info
        if info is None:
            return
        SamplingParams.from_dict(params_from_proto(params)).validate_for(
            prompt_len=len(ids),
            context_len=info.context_length,
            vocab_size=info.vocab_size,
            max_top_logprobs=self.config.max_top_logprobs,
        )

    def stop_streams(self, why: str) -> None:
        """End every worker stream still in flight: its request fails with
        Unavailable(why) (an SSE stream sends it as an error event, then [DONE])."""
        self.streams.stop(why)

    def _failed(
        self, worker: WorkerHandle, e: grpc.aio.AioRpcError | WorkerStalled, *, give_up: bool
    ) -> None:
        """After a worker call failed: raise when the request cannot go to another worker
        (it started streaming, or every worker would refuse it as this one did, or the
        router is shutting down); else count the retry."""
        if self.streams.stopping is not None:
            raise Unavailable(self.streams.stopping) from None
        if isinstance(e, grpc.aio.AioRpcError) and convert.is_overloaded(e):
            full = convert.error_from_rpc(e)
            assert isinstance(full, Overloaded)
            worker.shed(full)
        if give_up or not (isinstance(e, WorkerStalled) or retryable(e)):
            raise e
        status = "UNAVAILABLE" if isinstance(e, WorkerStalled) else e.code().name
        logger.info("worker %s failed (%s); retrying", worker.worker_id, status)
        self._count_retry()

    def _abort_later(self, worker: WorkerHandle, worker_rid: str) -> None:
        """End a resumable request its caller left (or that failed here): the worker
        holds it for a resume otherwise. Not when this router is stopping: then its
        callers resume elsewhere."""

        async def abort() -> bool:
            try:
                return await _abort_on(worker, worker_rid)
            except grpc.aio.AioRpcError:
                return False  # the worker is gone: so is the request

        task = asyncio.get_running_loop().create_task(abort())
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    def _count_retry(self) -> None:
        self.retries += 1
        self.metrics.retries.inc()

    async def _stream_from(
        self,
        attempt: _Attempt,
        wreq: worker_pb2.GenerateRequest,
        key: tuple[str, str],
        stream: bool,
    ) -> AsyncGenerator[common_pb2.GenerateChunk, None]:
        """One worker's Generate: its chunks (joined into one unless `stream`) under the
        caller's request id (`key`: caller, id), with the worker's load, breaker and the
        router's metrics kept as the call goes. The chunks come through the worker's output
        stream when it is open (outputs.py), else on the call; chunks that arrived while
        the caller was busy go on as one."""
        worker, pending = attempt.worker, attempt.pending
        started = False  # the worker streamed
        status = "CANCELLED"  # unless the stream ends or fails first
        worker.request_started(pending)  # prefill work queued there until the first chunk
        # The worker's id of the request (a resume's call has one of its own, for its
        # chunks: the first call may still be reading them on this router).
        held_rid = wreq.resume_from.request_id or wreq.request_id
        self.requests[key] = (worker, held_rid)
        sinks = worker.outputs.sinks
        wreq.output_stream = worker.outputs.stream_id or ""
        sink = sinks[wreq.request_id] = Sink(worker, worker.outputs.stream_id)
        call = worker.stub.Generate(wreq, metadata=worker.metadata)
        pump = asyncio.ensure_future(pump_call(call, sink))
        joined = Joined()
        try:
            self.streams.add(sink)
            done = False
            while not done:
                chunks = await sink.get()
                if not started:
                    started = True
                    worker.request_streaming(pending)
                    self.metrics.ttft.observe(time.perf_counter() - attempt.started_at)
                chunk = chunks[0] if len(chunks) == 1 else Joined.of(chunks)
                chunk.request_id = key[1]
                if chunk.HasField("finish"):
                    done = True
                    self.metrics.e2e.observe(time.perf_counter() - attempt.started_at)
                    self.metrics.prompt_tokens.inc(chunk.prompt_tokens)
                    self.metrics.cached_tokens.inc(chunk.cached_tokens)
                if stream:
                    attempt.forwarded = True
                    yield chunk
                else:
                    joined.add(chunk)
            if not stream:
                attempt.forwarded = True
                yield joined.chunk()
            worker.breaker.record_success()
            status = "OK"
        except (grpc.aio.AioRpcError, WorkerStalled) as e:
            status = "UNAVAILABLE" if isinstance(e, WorkerStalled) else e.code().name
            if isinstance(e, WorkerStalled) or convert.server_went_away(e):
                worker.breaker.record_failure()
            raise
        finally:
            self.streams.discard(sink)
            sinks.pop(wreq.request_id, None)
            pump.cancel()
            call.cancel()
            # A worker that refused the request (overloaded, bad input) holds nothing.
            held = started or status in ("CANCELLED", "UNAVAILABLE")
            if wreq.resumable and status != "OK" and held and self.streams.stopping is None:
                self._abort_later(worker, held_rid)
            if not started:
                worker.request_streaming(pending)
            worker.request_ended()
            self.metrics.worker_requests.labels(worker.worker_id, status).inc()
            self.requests.pop(key, None)

    # ---- embed and score ----------------------------------------------------------------

    async def route_and_embed(
        self, ids: list[int], pooling: common_pb2.Pooling, rid: str, caller: str = ""
    ) -> tuple[str, common_pb2.Embedding]:
        """A tokenized prompt's embedding and the worker that computed it, routed and
        retried as `route_and_stream` routes and retries a generation."""
        key = (caller, rid)
        self._claim(key)
        worker_rid = uuid.uuid4().hex
        wreq = worker_pb2.EmbedRequest(
            input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=ids)),
            pooling=pooling,
            request_id=worker_rid,
        )
        async with self.admission.slot():
            return await self._embed(ids, wreq, key, worker_rid)

    async def _embed(
        self, ids: list[int], wreq: worker_pb2.EmbedRequest, key: tuple[str, str], worker_rid: str
    ) -> tuple[str, common_pb2.Embedding]:
        tried: set[str] = set()
        last_error: grpc.aio.AioRpcError | None = None
        while len(tried) < self.config.max_attempts:
            try:
                worker, cached = self.picker.pick(ids, tried)
            except RadixMeshError:
                if last_error is not None:
                    break
                raise
            tried.add(worker.worker_id)
            pending = len(ids) - cached  # prefill work queued there until the answer
            worker.request_started(pending)
            self.requests[key] = (worker, worker_rid)
            try:
                resp = await worker.stub.Embed(wreq, metadata=worker.metadata)
                worker.breaker.record_success()
                self.metrics.prompt_tokens.inc(resp.embedding.prompt_tokens)
                self.metrics.cached_tokens.inc(resp.embedding.cached_tokens)
                return worker.worker_id, resp.embedding
            except grpc.aio.AioRpcError as e:
                if convert.server_went_away(e):
                    worker.breaker.record_failure()
                if not retryable(e):
                    raise
                last_error = e
                self._count_retry()
            finally:
                worker.request_streaming(pending)
                worker.request_ended()
                self.requests.pop(key, None)
        assert last_error is not None
        raise last_error

    async def score(
        self, ids: list[int], sreq: worker_pb2.ScoreRequest
    ) -> worker_pb2.ScoreResponse:
        """The worker's scores of a prompt's choices (`select`): one admission slot, the
        worker counts each choice. A cancelled call cancels the score: the worker aborts
        every choice."""
        async with self.admission.slot():
            worker, cached = self.picker.pick(ids, set())
            worker.request_started(len(ids) - cached)
            try:
                resp: worker_pb2.ScoreResponse = await worker.stub.Score(
                    sreq, metadata=worker.metadata
                )
                return resp
            finally:
                worker.request_streaming(len(ids) - cached)
                worker.request_ended()

    # ---- requests in flight -------------------------------------------------------------

    def find_request(self, rid: str, caller: str, anyone: bool) -> tuple[WorkerHandle, str] | None:
        """The worker serving the caller's request `rid` and its id there; with `anyone`
        (auth.Roles.reaches_all) anyone's, the caller's own first."""
        found = self.requests.get((caller, rid))
        if found is None and anyone:
            found = next((v for (_, r), v in self.requests.items() if r == rid), None)
        return found

    async def abort(self, rid: str, caller: str, anyone: bool) -> bool:
        """Abort the caller's request `rid` (`anyone`: or anyone's) on its worker: whether
        the worker had it."""
        found = self.find_request(rid, caller, anyone)
        return found is not None and await _abort_on(*found)

    async def abort_all(self, caller: str, anyone: bool) -> int:
        """Abort every request of the caller in flight (`anyone`: every request): how many
        the workers found."""
        targets = [v for (c, _), v in self.requests.items() if anyone or c == caller]
        return sum(await asyncio.gather(*(_abort_on(w, wrid) for w, wrid in targets)))


async def _abort_on(worker: WorkerHandle, worker_rid: str) -> bool:
    resp = await worker.stub.Abort(
        worker_pb2.AbortRequest(request_id=worker_rid), metadata=worker.metadata
    )
    return bool(resp.found)


@dataclass
class _Attempt:
    """One try of a request on one worker."""

    worker: WorkerHandle
    pending: int  # the prompt tokens it has to prefill (not cached there)
    started_at: float  # perf_counter() when the request reached the router
    forwarded: bool = False  # the caller got a chunk: no retry elsewhere after this


def _not_found(e: grpc.aio.AioRpcError | WorkerStalled) -> bool:
    return isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.NOT_FOUND
