"""The gRPC worker server: the `radixmesh.v1.Worker` service over one `Engine`.

Protobuf types live here and nowhere else in the worker; `radixmesh.wire` converts the
engine's outputs, stats and events to messages. Before the engine is attached every
RPC answers UNAVAILABLE; the process around it (listening, health, drain) is serving.py.

A Generate stream (or an Embed call) that the client cancels, disconnects or lets pass
its deadline is aborted in the engine (its KV is back before the next scheduler step).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from radixmesh.errors import (
    Internal,
    InvalidArgument,
    Overloaded,
    RadixMeshError,
    Unavailable,
)
from radixmesh.grpc_server import (
    PENDING_CALL_OPTIONS,
    abort_rpc,
)
from radixmesh.keepalive import KEEPALIVE
from radixmesh.listener import ListenerLimits
from radixmesh.listener import grpc_options as listener_options
from radixmesh.prefix import block_hashes, common_prefix_len
from radixmesh.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from radixmesh.wire import (
    input_ids_from_proto,
    load_age_metadata,
    params_from_proto,
    pooling_from_proto,
    score_response,
)
from radixmesh.worker.cache_event_hub import CacheEventHub
from radixmesh.worker.load_report import LoadReporter
from radixmesh.worker.metrics import WorkerMetrics
from radixmesh.worker.output_stream import (
    MAX_OUTPUT_STREAMS,
    OutputStream,
    first_and_rest,
    join,
)
from radixmesh.worker.proto_out import (
    chunk_to_proto,
    embedding_to_proto,
    event_to_proto,
    load_to_proto,
    model_info_to_proto,
)
from radixmesh.worker.request_output import Delivery
from radixmesh.worker.resumable import HeldRequests, OutputLog, ResumeConfig
from radixmesh.worker.stats import SchedulerStats
from radixmesh.worker.stored_responses import StoredResponses

if TYPE_CHECKING:
    from radixmesh.worker.request_output import RequestOutput
    from radixmesh.worker.serving_engine import ServingEngine

logger = logging.getLogger(__name__)

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name


@dataclass(frozen=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 50051
    metrics_port: int | None = None
    drain_timeout: float = 30.0  # seconds in-flight requests get to finish on SIGTERM
    # Clients must send `authorization: Bearer <key>`.
    api_key: str | None = field(default=None, repr=False)
    tls_cert: str | None = None  # PEM files; both set: serve TLS
    tls_key: str | None = None
    tls_client_ca: str | None = None  # PEM CA bundle: clients must present a certificate
    max_message_bytes: int = 64 * 1024 * 1024
    # Generate streams in flight beyond which new ones get RESOURCE_EXHAUSTED; None: the
    # engine's max_running_requests + max_queued_requests.
    max_in_flight: int | None = None
    # Run the engine in a child process (worker/engine_process.py says why); False: in this
    # process, beside the gRPC event loop.
    engine_process: bool = True
    # Seconds between stats log lines while serving (logged when they changed); 0: none.
    log_stats_interval: float = 10.0
    # How long and how much a resumable request's output is held once its caller's
    # connection dropped (resumable.py).
    resume: ResumeConfig = field(default_factory=ResumeConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise InvalidArgument("port", f"must be in [0, 65536), got {self.port}")
        if self.drain_timeout < 0:
            raise InvalidArgument("drain_timeout", f"must be >= 0, got {self.drain_timeout}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("tls_cert", "give both tls_cert and tls_key, or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise InvalidArgument("tls_client_ca", "client certificates need tls_cert/tls_key")
        if self.log_stats_interval < 0:
            raise InvalidArgument(
                "log_stats_interval", f"must be >= 0, got {self.log_stats_interval}"
            )


def grpc_options(max_message_bytes: int, max_connections: int) -> list[tuple[str, int]]:
    """Message limits, keepalive pings that keep idle streams (long prefills) alive, and
    the default connection limits (radixmesh/listener.py: the router's few connections
    never come near them). No SO_REUSEPORT (grpc-core sets it by default): a worker
    started on a port another server holds fails to start, where with it both would
    listen and the kernel would split the router's connections between them."""
    return [
        ("grpc.so_reuseport", 0),
        *listener_options(ListenerLimits(), max_connections),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        *KEEPALIVE.server_options(),  # what the routers' channels keep to
        *PENDING_CALL_OPTIONS,
    ]


# ---- the servicer ---------------------------------------------------------------------------


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, config: ServerConfig, model_name: str = "") -> None:
        self.config = config
        self.engine: ServingEngine | None = None
        self.load: LoadReporter | None = None  # GetLoad's answers, without waiting on the engine
        self.hub: CacheEventHub | None = None
        self.metrics = WorkerMetrics(self.read_stats, model_name)
        self.in_flight: set[str] = set()
        self.output_streams: dict[str, OutputStream] = {}  # StreamOutputs' by name
        self.scoring = 0  # continuations of Score calls in flight (each one request)
        # Resumable requests, held for a resume when their caller went away.
        self.held = HeldRequests(config.resume, self._abort_in_engine)
        self.metrics.watch_held(self.held)
        self.max_in_flight = config.max_in_flight or 0
        self._load_samples: collections.deque[tuple[float, int]] = collections.deque()
        # The Responses API's stored entries that router replicas put here (any replica
        # finds them again by the response id, which names this worker).
        self.stored_responses = StoredResponses()

    def attach(self, engine: ServingEngine, hub: CacheEventHub) -> None:
        sc = engine.config.scheduler
        if not self.config.max_in_flight:
            self.max_in_flight = sc.running_cap + sc.max_queued_requests
        self.engine, self.hub = engine, hub
        self.load = LoadReporter(engine.get_stats)

    @property
    def busy(self) -> int:
        """Requests in flight: Generate streams, resumable requests still generating and
        Score continuations."""
        return len(self.in_flight) + self.held.generating + self.scoring

    @property
    def unsent(self) -> int:
        """What a drain waits for: `busy`, and finished resumable requests whose call has
        not yet passed their last outputs on (`HeldRequests.delivering`)."""
        return self.busy + self.held.delivering

    def _abort_in_engine(self, rid: str) -> None:
        if self.engine is not None:
            self.engine.abort(rid)

    def read_stats(self) -> SchedulerStats | None:
        engine = self.engine
        return None if engine is None else engine.get_stats()

    def _engine(self) -> ServingEngine:
        if self.engine is None:
            raise Unavailable("the model is still loading")
        return self.engine

    # ---- generate -----------------------------------------------------------------------

    async def Generate(
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        resume = request.resume_from if request.HasField("resume_from") else None
        rid = request.request_id or uuid.uuid4().hex  # this call's chunks go under it
        stream: AsyncIterator[RequestOutput] | None = None
        sink: OutputStream | None = None
        log: OutputLog | None = None
        finished = False
        announced = False  # the routers were told of it by id: they hear of its end too
        try:
            engine = self._engine()
            if resume is not None:  # a held request (resumable.py): no new work
                log = self.held.attach(resume.request_id, request.owner)
                outputs = log.follow(resume.offset)
            else:
                self._admit(1)
                if rid in self.in_flight or rid in self.held.logs:
                    raise InvalidArgument("request_id", f"request {rid!r} is already in flight")
                ids = self._input_ids(request.input)
                params = params_from_proto(request.sampling_params)
                stream = engine.async_stream(ids, params, rid=rid, delivery=_delivery(request))
                # A resumable request outlives its call: announced without its id.
                announced = self._announce(engine, ids, "" if request.resumable else rid)
                if request.resumable:
                    log = self.held.start(rid, request.owner, self._timed(stream))
                    outputs = log.follow(0)
                else:
                    self.in_flight.add(rid)
                    outputs = self._timed(stream)
                    if announced:
                        outputs = self._announce_start(outputs, rid)
            sink = self.output_streams.get(request.output_stream)
            if sink is not None:
                first = True
                async for out in outputs:
                    finished = out.finished
                    sink.put(rid, out, send=request.stream or first or out.finished)
                    first = False
            elif request.stream:
                async for out in outputs:
                    finished = out.finished
                    yield worker_pb2.GenerateResponse(chunk=chunk_to_proto(rid, out))
            elif request.first_and_rest:
                async for part in first_and_rest(outputs):
                    yield worker_pb2.GenerateResponse(chunk=chunk_to_proto(rid, part))
                finished = True
            else:
                joined = await join(outputs)
                yield worker_pb2.GenerateResponse(chunk=chunk_to_proto(rid, joined, whole=True))
                finished = True
        except RadixMeshError as e:
            await abort_rpc(context, e)
        except Exception as e:
            if isinstance(e, grpc.aio.AbortError):
                raise
            logger.exception("Generate failed")
            await abort_rpc(context, Internal(f"{type(e).__name__}: {e}"))
        finally:
            if log is not None:
                # A resumable request runs on without its call (an Abort ends it).
                self.held.detach(log)
            elif stream is not None and not finished and self.engine is not None:
                # A cancelled / disconnected / expired stream: abort it in the engine now.
                self.engine.abort(rid)
            if sink is not None and not finished:
                sink.discard(rid)  # what it held for a request that ends with an error
            if log is None:
                self.in_flight.discard(rid)
            if announced and self.hub is not None:
                self.hub.publish_request("request_ended", rid)

    def _announce(self, engine: ServingEngine, ids: list[int], rid: str) -> bool:
        """Tell the routers (cache-event subscribers) which prefix blocks this request
        will leave cached: each router replica then counts them as tentatively here. With
        `rid`, each also counts the request on this worker until its "ended" event (router/
        pool.py). Whether the routers were told of `rid`."""
        hub = self.hub
        if hub is None or not hub.subscribed:
            return False
        size = engine.config.cache.event_block_size
        hub.publish_pending(tuple(block_hashes(ids, size)), size, rid)
        return bool(rid)

    async def _announce_start(
        self, outputs: AsyncIterator[RequestOutput], rid: str
    ) -> AsyncIterator[RequestOutput]:
        """`outputs`, telling the routers when the first one comes: the prompt is prefilled
        (their pending-prefill estimate of the request ends)."""
        first = True
        async for out in outputs:
            if first and self.hub is not None:
                self.hub.publish_request("request_started", rid)
                first = False
            yield out

    def _admit(self, n: int) -> None:
        """Overloaded unless n more requests fit (Generate streams and Score continuations
        count alike)."""
        busy = self.busy
        if busy + n > self.max_in_flight:
            raise Overloaded(
                f"{busy} requests in flight, {n} more would pass the limit of "
                f"{self.max_in_flight}: the queue is full"
            )

    async def _timed(self, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
        """Observe time-to-first-token, inter-token and end-to-end latency."""
        m = self.metrics
        start = last = time.monotonic()
        first = True
        async for out in stream:
            now = time.monotonic()
            n = len(out.new_token_ids)
            if n and first:
                m.ttft.observe(now - start)
                first = False
            elif n:
                for _ in range(n):
                    m.itl.observe((now - last) / n)
            if n:
                last = now
            if out.finished:
                m.e2e.observe(now - start)
                m.observe_finished(out.meta_info)
            yield out

    def _input_ids(self, inp: common_pb2.Input) -> list[int]:
        return input_ids_from_proto(inp, self._engine().tokenizer)

    # ---- embed --------------------------------------------------------------------------

    async def Embed(
        self, request: worker_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.EmbedResponse:
        rid = request.request_id or uuid.uuid4().hex

        async def run() -> worker_pb2.EmbedResponse:
            engine = self._engine()
            self._admit(1)
            if rid in self.in_flight:
                raise InvalidArgument("request_id", f"request {rid!r} is already in flight")
            ids = self._input_ids(request.input)
            self.in_flight.add(rid)
            try:  # a cancelled call cancels async_encode, which aborts the request
                out = await engine.async_encode(ids, pooling_from_proto(request.pooling), rid)
            finally:
                self.in_flight.discard(rid)
            return worker_pb2.EmbedResponse(embedding=embedding_to_proto(out))

        return await _unary(context, run)

    # ---- score / abort / load -----------------------------------------------------------

    async def Score(
        self, request: worker_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ScoreResponse:
        async def run() -> worker_pb2.ScoreResponse:
            engine = self._engine()
            self._admit(len(request.continuations))
            prompt = self._input_ids(request.input)
            conts = [self._continuation(request.input, prompt, c) for c in request.continuations]
            self.scoring += len(conts)
            try:  # a cancelled call cancels async_score, which aborts every continuation
                scores = await engine.async_score(prompt, conts)
            finally:
                self.scoring -= len(conts)
            return score_response(conts, scores, len(prompt))

        return await _unary(context, run)

    def _continuation(
        self, inp: common_pb2.Input, prompt: list[int], cont: worker_pb2.Continuation
    ) -> list[int]:
        if cont.WhichOneof("kind") == "token_ids":
            return list(cont.token_ids.ids)
        tok = self._engine().tokenizer
        if inp.WhichOneof("kind") == "text" and cont.text:
            # Tokenize prompt + continuation together (how the model would see it) and keep
            # what lies past the shared prefix.
            full = tok.encode(inp.text + cont.text)
            tail = full[common_prefix_len(prompt, full) :]
            if tail and full[: len(full) - len(tail)] == prompt:
                return tail
        return tok.encode(cont.text)

    async def Abort(
        self, request: worker_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.AbortResponse:
        async def run() -> worker_pb2.AbortResponse:
            engine = self._engine()
            found = request.request_id in self.in_flight
            if found:
                engine.abort(request.request_id)
            found = self.held.abort(request.request_id) or found
            return worker_pb2.AbortResponse(found=found)

        return await _unary(context, run)

    async def GetLoad(
        self, request: worker_pb2.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetLoadResponse:
        async def run() -> worker_pb2.GetLoadResponse:
            engine = self._engine()
            assert self.load is not None
            s, age = await self.load.current()  # the last load, and its age, if the engine is busy
            context.set_trailing_metadata(load_age_metadata(age, engine.info.deterministic))
            throughput = self._throughput(s.generated_tokens)
            return load_to_proto(s, throughput, engine.draining, self.busy)

        return await _unary(context, run)

    def _throughput(self, generated: int, window: float = 10.0) -> float:
        """Generated tokens per second between this call and the oldest within `window`."""
        now = time.monotonic()
        samples = self._load_samples
        samples.append((now, generated))
        while len(samples) > 2 and now - samples[1][0] >= window:
            samples.popleft()
        t0, g0 = samples[0]
        return (generated - g0) / (now - t0) if now > t0 else 0.0

    def close_output_streams(self) -> None:
        """End every output stream once it has sent what is ready (the server stops)."""
        for sink in self.output_streams.values():
            sink.close()

    async def StreamOutputs(
        self, request: worker_pb2.StreamOutputsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.StreamOutputsResponse]:
        """Batches of the outputs of the requests that name this stream (output_stream.py);
        open until the caller cancels it or the server stops (after its drain: the last
        outputs go first)."""
        name = request.stream_id
        try:
            self._engine()
            if not name or len(name) > 128:
                raise InvalidArgument("stream_id", "give a name of 1 to 128 characters")
            if name in self.output_streams:
                raise InvalidArgument("stream_id", f"a stream named {name!r} is open")
            if len(self.output_streams) >= MAX_OUTPUT_STREAMS:
                raise Overloaded(f"{MAX_OUTPUT_STREAMS} output streams are open")
        except RadixMeshError as e:
            await abort_rpc(context, e)
        sink = self.output_streams[name] = OutputStream()
        try:
            await context.send_initial_metadata(())  # tells the caller the name is open
            while (batch := await sink.take()) is not None:
                yield worker_pb2.StreamOutputsResponse(
                    chunks=[chunk_to_proto(rid, out) for rid, out in batch]
                )
        finally:
            sink.close()
            del self.output_streams[name]

    # ---- cache ----------------------------------------------------------------------------

    async def StreamCacheEvents(
        self, request: worker_pb2.StreamCacheEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.StreamCacheEventsResponse]:
        try:
            self._engine()
        except RadixMeshError as e:
            await abort_rpc(context, e)
        hub = self.hub
        assert hub is not None
        q = hub.subscribe()
        try:
            while (item := await q.get()) is not None:
                yield worker_pb2.StreamCacheEventsResponse(
                    event=event_to_proto(hub.epoch, item.sequence, item.event)
                )
        finally:
            hub.unsubscribe(q)

    async def GetCacheSnapshot(
        self, request: worker_pb2.GetCacheSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetCacheSnapshotResponse:
        async def run() -> worker_pb2.GetCacheSnapshotResponse:
            engine = self._engine()
            assert self.hub is not None
            snap = await self.hub.snapshot()
            return worker_pb2.GetCacheSnapshotResponse(
                epoch=snap.epoch,
                sequence=snap.sequence,
                block_size=engine.config.cache.event_block_size,
                events=[event_to_proto(snap.epoch, snap.sequence, e) for e in snap.events],
            )

        return await _unary(context, run)

    async def FlushCache(
        self, request: worker_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.FlushCacheResponse:
        async def run() -> worker_pb2.FlushCacheResponse:
            engine = self._engine()
            return worker_pb2.FlushCacheResponse(
                flushed=await asyncio.to_thread(engine.flush_cache)
            )

        return await _unary(context, run)

    async def GetModelInfo(
        self, request: worker_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetModelInfoResponse:
        async def run() -> worker_pb2.GetModelInfoResponse:
            engine = self._engine()
            template = getattr(
                getattr(engine.tokenizer, "hf_tokenizer", None), "chat_template", None
            )
            cache = engine.config.cache
            info = model_info_to_proto(
                engine.info,
                cache.page_size,
                cache.event_block_size,
                template if isinstance(template, str) else "",
            )
            return worker_pb2.GetModelInfoResponse(info=info)

        return await _unary(context, run)

    # ---- stored responses (worker/stored_responses.py) ---------------------------------

    async def PutStoredResponse(
        self, request: worker_pb2.PutStoredResponseRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PutStoredResponseResponse:
        async def run() -> worker_pb2.PutStoredResponseResponse:
            stored = self.stored_responses.put(
                request.caller, request.response_id, request.entry, request.ttl_seconds
            )
            return worker_pb2.PutStoredResponseResponse(stored=stored)

        return await _unary(context, run)

    async def GetStoredResponse(
        self, request: worker_pb2.GetStoredResponseRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetStoredResponseResponse:
        async def run() -> worker_pb2.GetStoredResponseResponse:
            entry = self.stored_responses.get(request.caller, request.response_id)
            if entry is None:
                return worker_pb2.GetStoredResponseResponse(found=False)
            return worker_pb2.GetStoredResponseResponse(found=True, entry=entry)

        return await _unary(context, run)

    async def DeleteStoredResponse(
        self, request: worker_pb2.DeleteStoredResponseRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DeleteStoredResponseResponse:
        async def run() -> worker_pb2.DeleteStoredResponseResponse:
            deleted = self.stored_responses.delete(request.caller, request.response_id)
            return worker_pb2.DeleteStoredResponseResponse(deleted=deleted)

        return await _unary(context, run)


async def _unary(context: grpc.aio.ServicerContext, run: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await run()
    except RadixMeshError as e:
        await abort_rpc(context, e)
    except Exception as e:
        if isinstance(e, grpc.aio.AbortError):
            raise
        logger.exception("RPC failed")
        await abort_rpc(context, Internal(f"{type(e).__name__}: {e}"))


def _delivery(request: worker_pb2.GenerateRequest) -> Delivery:
    """The outputs the engine hands this call: each step's for a stream (and for a
    resumable request, whose log a stream may follow later); else the first, then the
    rest in one, which is all `first_and_rest`, an output stream that is not streaming
    and a joined result send on. The first stays its own output even for a joined
    result: the latency metrics (`_timed`) take time to first token from it, and the
    tokens after it, arriving in one output, each count their mean gap, as for a stream
    whose reader fell behind."""
    if request.stream or request.resumable:
        return Delivery.STEPS
    return Delivery.FIRST_AND_LAST
