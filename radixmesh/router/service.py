"""The `radixmesh.v1.Router` servicer: tokenize once, route, proxy the worker's stream.

Generate: the prompt is tokenized here (chat template for messages), hashed into prefix
blocks, matched against every worker's summary, and a policy picks the worker; the worker
gets token ids. A worker that fails before the first chunk reaches the client (UNAVAILABLE,
or overloaded: RESOURCE_EXHAUSTED with retry-after metadata) is left for another, up to
`max_attempts` workers; once a chunk has been forwarded, a failure ends the stream with
the worker's status.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import grpc

from radixmesh.auth import ADMIN_MESSAGE
from radixmesh.client import convert
from radixmesh.errors import (
    InvalidArgument,
    Overloaded,
    PermissionDenied,
    RadixMeshError,
    Unavailable,
)
from radixmesh.grpc_server import abort_rpc
from radixmesh.prefix import block_hashes
from radixmesh.router.admission import Admission, RateLimiter
from radixmesh.router.config import RouterConfig
from radixmesh.router.metrics import RouterMetrics
from radixmesh.router.outputs import Joined, Sink, SinkWatch, WorkerStalled, pump_call
from radixmesh.router.policy import Candidate, Policy, PolicyOptions, make_policy
from radixmesh.router.pool import WorkerHandle, WorkerPool
from radixmesh.router.programs import ProgramHint, ProgramTable
from radixmesh.router.rpc import authorization, caller_of_call, fail, unary
from radixmesh.sampling_params import SamplingParams
from radixmesh.tokenizer import TokenizerLike, tokenizer_for
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc, worker_pb2
from radixmesh.wire import input_ids_from_proto, params_from_proto

logger = logging.getLogger(__name__)

# This replica's name in ClusterStatus: replicas sharing one address are told apart by it.
ROUTER_ID = f"{socket.gethostname()}:{os.getpid()}"


def retryable(e: grpc.aio.AioRpcError) -> bool:
    """Whether another worker may serve a request that failed so before its first chunk:
    the worker was gone or going, or overloaded (never a message over gRPC's size limits,
    also RESOURCE_EXHAUSTED, which every worker would refuse)."""
    return convert.server_went_away(e) or convert.is_overloaded(e)


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(
        self, config: RouterConfig, pool: WorkerPool, metrics: RouterMetrics | None = None
    ) -> None:
        self.config = config
        self.pool = pool
        self.metrics = metrics if metrics is not None else RouterMetrics(pool)
        options = PolicyOptions(
            request_cost_tokens=config.request_cost_tokens,
            pending_prefill_weight=config.pending_prefill_weight,
        )
        self.policy: Policy = make_policy(config.policy, config.seed, options)
        self.tokenizer: TokenizerLike | None = None
        self.model_info: common_pb2.ModelInfo | None = None
        # (caller, request id) -> the worker serving it and the id it has there: a caller
        # reaches only its own requests (auth.caller_of), and ids never collide on a worker.
        self.requests: dict[tuple[str, str], tuple[WorkerHandle, str]] = {}
        self.retries = 0
        self.programs = ProgramTable(config.program_max_queued)
        self.admission = Admission(
            config.max_concurrent_requests, config.max_queued_requests, config.queue_timeout
        )
        self.rate = RateLimiter(
            config.rate_limit, config.rate_burst or math.ceil(config.rate_limit)
        )
        self.metrics.watch_admission(self.admission, self.rate)
        self.streams = SinkWatch(config.stream_stall_timeout)

    async def load_model_info(self) -> None:
        """Ask a healthy worker what it serves and load the same tokenizer."""
        for w in self.pool.workers.values():
            if not w.healthy:
                continue
            resp = await w.stub.GetModelInfo(
                worker_pb2.GetModelInfoRequest(), timeout=30, metadata=w.metadata
            )
            # The router only tokenizes: the shared loader, fed the worker's vocabulary.
            info = resp.info
            self.tokenizer = await asyncio.to_thread(
                tokenizer_for,
                info.tokenizer,
                vocab_size=info.vocab_size,
                eos_token_ids=info.eos_token_ids,
                bos_token_id=info.bos_token_id if info.HasField("bos_token_id") else None,
                download_dir=self.config.download_dir,
                chat_template=info.chat_template or None,
            )
            self.model_info = resp.info
            return
        raise Unavailable("no healthy worker to ask for the model")

    # ---- routing ------------------------------------------------------------------------

    def route(
        self, ids: list[int], exclude: set[str], hint: ProgramHint | None = None
    ) -> tuple[WorkerHandle, int]:
        """The worker for a prompt and how many of its tokens that worker caches; a
        program's request stays with its program while that worker's load allows."""
        started = time.perf_counter()
        hashes: dict[int, list[int]] = {}
        cached: dict[str, int] = {}
        candidates = []
        for wid, w in self.pool.workers.items():
            bs = w.block_size
            if not bs:
                cached[wid] = 0
            else:
                if bs not in hashes:
                    hashes[bs] = block_hashes(ids, bs)
                cached[wid] = w.summary.match(hashes[bs]) * bs
            c = w.candidate(cached[wid])
            if wid in exclude:
                c = c._replace(healthy=False)
            candidates.append(c)
        chosen_id = self.programs.home(hint, candidates)
        if chosen_id is None:
            try:
                chosen_id = self.policy.choose(len(ids), candidates)
            except Unavailable:
                # Workers that said they are full are left out while others can serve;
                # when none can, one of them gets the request (it may have room now).
                chosen_id = self.policy.choose(len(ids), self._with_full(candidates, exclude))
            self.programs.placed(hint, chosen_id)
        chosen = self.pool.workers[chosen_id]
        if chosen.block_size:
            chosen.summary.add_tentative(hashes[chosen.block_size], self.config.tentative_ttl)
            self.pool.index.enforce_budget()
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        self.metrics.decisions.labels(self.policy.name, chosen.worker_id).inc()
        return chosen, cached[chosen.worker_id]

    def _with_full(self, candidates: list[Candidate], exclude: set[str]) -> list[Candidate]:
        """`candidates` with the workers that are only full (up, breaker closed) healthy."""
        workers = self.pool.workers
        return [
            c._replace(healthy=True)
            if not c.healthy
            and c.worker_id not in exclude
            and workers[c.worker_id].full
            and workers[c.worker_id].reachable
            and workers[c.worker_id].breaker.allows()
            else c
            for c in candidates
        ]

    async def _input_ids(self, inp: common_pb2.Input) -> list[int]:
        """The prompt's token ids; text is tokenized on a thread (a long prompt must not
        stall the loop), after its size is checked."""
        tok = self.tokenizer
        if tok is None:
            raise Unavailable("the router is still starting")
        limit = self.config.max_prompt_bytes
        if inp.WhichOneof("kind") == "token_ids":
            return input_ids_from_proto(inp, tok, max_text_bytes=limit)
        return await asyncio.to_thread(input_ids_from_proto, inp, tok, max_text_bytes=limit)

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
    ) -> AsyncGenerator[tuple[str, common_pb2.GenerateChunk], None]:
        """Route a tokenized prompt; yield (worker id, chunk) as the worker streams them.
        `rid` is the caller's id for it (`caller`: auth.caller_of its key); the worker gets
        an id of the router's own.

        Both front ends (gRPC and HTTP) generate through here. Raises a `RadixMeshError`
        when no worker can be chosen, or the worker's `grpc.aio.AioRpcError` (after
        retries on other workers while nothing was yielded). Closing the generator early
        (a client that went away) cancels the worker's call, which aborts the request there.

        The worker's first chunk tells the router that the prefill is done (cache_aware's
        pending-prefill term stops counting the request then). For a client that asked
        for no stream, the worker sends just that chunk and then the rest joined
        (`first_and_rest`), which are joined into one here: two messages a request, not
        one a token.
        """
        self._check_against_the_model(ids, params)
        key = (caller, rid)
        if key in self.requests:
            raise InvalidArgument("request_id", f"request {rid[:128]!r} is already in flight")
        worker_rid = uuid.uuid4().hex
        wreq = worker_pb2.GenerateRequest(
            input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=ids)),
            sampling_params=params,
            request_id=worker_rid,
            stream=stream,
            first_and_rest=not stream,
        )
        tried: set[str] = set()
        last_error: grpc.aio.AioRpcError | WorkerStalled | None = None
        t0 = time.perf_counter()  # for the router-side latency histograms
        async with self.admission.slot():  # before routing: a refusal leaves no load behind
            while len(tried) < min(self.config.max_attempts, len(self.pool.workers)):
                try:
                    worker, cached = self.route(ids, tried, hint)
                except RadixMeshError:
                    if last_error is not None:
                        break
                    raise
                tried.add(worker.worker_id)
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

    def _check_against_the_model(self, ids: list[int], params: common_pb2.SamplingParams) -> None:
        """The workers' checks against the model, made here first: a prompt past the context
        is refused before it is hashed, routed and sent (a 4 MiB one took 0.25 s of the
        event loop that way)."""
        info = self.model_info
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
        self.requests[key] = (worker, wreq.request_id)
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
            if not started:
                worker.request_streaming(pending)
            worker.request_ended()
            self.metrics.worker_requests.labels(worker.worker_id, status).inc()
            self.requests.pop(key, None)

    async def Generate(
        self, request: router_pb2.RouterGenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[router_pb2.RouterGenerateResponse]:
        with self.metrics.request("grpc", "Generate") as record:
            rid = request.request_id or uuid.uuid4().hex
            try:
                if len(rid) > MAX_REQUEST_ID:
                    raise InvalidArgument("request_id", f"at most {MAX_REQUEST_ID} characters")
                self.rate.take(caller_of_call(context))
                top = request.sampling_params.top_logprobs_num
                self.config.limits.check_top_logprobs("sampling_params.top_logprobs_num", top)
                ids = await self._input_ids(request.input)
                hint = program_hint(request.program_id, request.shared_prefix_tokens)
                chunks = self.route_and_stream(
                    ids,
                    request.sampling_params,
                    rid,
                    stream=request.stream,
                    hint=hint,
                    caller=caller_of_call(context),
                )
                async with aclosing(chunks):
                    async for worker_id, chunk in chunks:
                        yield router_pb2.RouterGenerateResponse(chunk=chunk, worker_id=worker_id)
            except (RadixMeshError, grpc.aio.AioRpcError) as e:
                await fail(context, e, record)

    # ---- embed --------------------------------------------------------------------------

    async def route_and_embed(
        self, ids: list[int], pooling: common_pb2.Pooling, rid: str, caller: str = ""
    ) -> tuple[str, common_pb2.Embedding]:
        """A tokenized prompt's embedding and the worker that computed it, routed and
        retried as `route_and_stream` routes and retries a generation."""
        key = (caller, rid)
        if key in self.requests:
            raise InvalidArgument("request_id", f"request {rid[:128]!r} is already in flight")
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
        while len(tried) < min(self.config.max_attempts, len(self.pool.workers)):
            try:
                worker, cached = self.route(ids, tried)
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
                self.retries += 1
                self.metrics.retries.inc()
            finally:
                worker.request_streaming(pending)
                worker.request_ended()
                self.requests.pop(key, None)
        assert last_error is not None
        raise last_error

    async def Embed(
        self, request: router_pb2.RouterEmbedRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterEmbedResponse:
        async def run() -> router_pb2.RouterEmbedResponse:
            self.rate.take(caller_of_call(context))
            ids = await self._input_ids(request.input)
            rid = request.request_id or uuid.uuid4().hex
            worker_id, embedding = await self.route_and_embed(
                ids, request.pooling, rid, caller_of_call(context)
            )
            return router_pb2.RouterEmbedResponse(embedding=embedding, worker_id=worker_id)

        with self.metrics.request("grpc", "Embed") as record:
            return await unary(context, run, record)

    # ---- the other RPCs -----------------------------------------------------------------

    async def Select(
        self, request: router_pb2.SelectRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.SelectResponse:
        async def run() -> router_pb2.SelectResponse:
            self.rate.take(caller_of_call(context))
            if len(request.choices) > self.config.max_choices:
                raise InvalidArgument(
                    "choices", f"at most {self.config.max_choices}, got {len(request.choices)}"
                )
            ids = await self._input_ids(request.input)
            sreq = convert.score_request(request.input, list(request.choices))
            async with self.admission.slot():  # one slot; the worker counts each choice
                worker, cached = self.route(ids, set())
                worker.request_started(len(ids) - cached)
                try:  # a cancelled call cancels the score: the worker aborts every choice
                    resp = await worker.stub.Score(sreq, metadata=worker.metadata)
                finally:
                    worker.request_streaming(len(ids) - cached)
                    worker.request_ended()
            sel = convert.selection_from_scores(list(request.choices), resp)
            return router_pb2.SelectResponse(
                index=sel.index,
                text=sel.text,
                normalized_logprobs=sel.normalized_logprobs,
                sum_logprobs=sel.sum_logprobs,
            )

        with self.metrics.request("grpc", "Select") as record:
            return await unary(context, run, record)

    async def Abort(
        self, request: router_pb2.RouterAbortRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterAbortResponse:
        async def run() -> router_pb2.RouterAbortResponse:
            me = caller_of_call(context)
            anyone = self.config.roles.reaches_all(authorization(context))
            found = self.find_request(request.request_id, me, anyone)
            if found is None:
                return router_pb2.RouterAbortResponse(found=False)
            worker, worker_rid = found
            resp = await worker.stub.Abort(
                worker_pb2.AbortRequest(request_id=worker_rid), metadata=worker.metadata
            )
            return router_pb2.RouterAbortResponse(found=resp.found)

        return await unary(context, run)

    def find_request(self, rid: str, caller: str, anyone: bool) -> tuple[WorkerHandle, str] | None:
        """The worker serving the caller's request `rid` and its id there; with `anyone`
        (auth.Roles.reaches_all) anyone's, the caller's own first."""
        found = self.requests.get((caller, rid))
        if found is None and anyone:
            found = next((v for (_, r), v in self.requests.items() if r == rid), None)
        return found

    def _admin(self, context: grpc.aio.ServicerContext) -> bool:
        return self.config.roles.admin(authorization(context))

    async def _require_admin(self, context: grpc.aio.ServicerContext) -> None:
        if not self._admin(context):
            await abort_rpc(context, PermissionDenied(ADMIN_MESSAGE))

    async def ClusterStatus(
        self, request: router_pb2.ClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.ClusterStatusResponse:
        await self._require_admin(context)
        return router_pb2.ClusterStatusResponse(
            router_id=ROUTER_ID,
            workers=[
                router_pb2.WorkerStatus(
                    worker_id=w.worker_id,
                    address=w.address,
                    healthy=w.healthy,
                    num_running=w.load.num_running,
                    num_waiting=w.load.num_waiting,
                    kv_tokens_used=w.load.kv_tokens_used,
                    kv_tokens_total=w.load.kv_tokens_total,
                    cache_hit_rate=w.load.cache_hit_rate,
                    cached_blocks=w.summary.num_confirmed,
                )
                for w in self.pool.workers.values()
            ],
        )

    async def flush_all(self) -> tuple[int, int]:
        """Flush every worker's cache: (how many flushed, how many workers)."""

        async def flush(w: WorkerHandle) -> bool:
            try:
                resp = await w.stub.FlushCache(
                    worker_pb2.FlushCacheRequest(), timeout=30, metadata=w.metadata
                )
            except grpc.aio.AioRpcError:
                return False
            return bool(resp.flushed)

        results = await asyncio.gather(*(flush(w) for w in self.pool.workers.values()))
        return sum(results), len(results)

    async def FlushCache(
        self, request: router_pb2.RouterFlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterFlushCacheResponse:
        await self._require_admin(context)
        flushed, total = await self.flush_all()
        return router_pb2.RouterFlushCacheResponse(flushed=flushed, total=total)

    async def GetModelInfo(
        self, request: router_pb2.RouterGetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterGetModelInfoResponse:
        async def run() -> router_pb2.RouterGetModelInfoResponse:
            if self.model_info is None:
                raise Unavailable("the router is still starting")
            return router_pb2.RouterGetModelInfoResponse(info=self.model_info)

        return await unary(context, run)


@dataclass
class _Attempt:
    """One try of a request on one worker."""

    worker: WorkerHandle
    pending: int  # the prompt tokens it has to prefill (not cached there)
    started_at: float  # perf_counter() when the request reached the router
    forwarded: bool = False  # the caller got a chunk: no retry elsewhere after this


MAX_PROGRAM_ID = 128
MAX_REQUEST_ID = 256


def program_hint(program_id: str, shared_prefix_tokens: int) -> ProgramHint | None:
    """A request's program hint (None without an id); a client's id is bounded."""
    if not program_id:
        return None
    if len(program_id) > MAX_PROGRAM_ID:
        raise InvalidArgument("program_id", f"at most {MAX_PROGRAM_ID} characters")
    return ProgramHint(program_id, shared_prefix_tokens)
