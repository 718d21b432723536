"""The `radixmesh.v1.Router` servicer: tokenize once, route, proxy the worker's stream.

Generate: the prompt is tokenized here (chat template for messages), hashed into prefix
blocks, matched against every worker's summary, and a policy picks the worker; the worker
gets token ids. A worker that fails before the first chunk reaches the client (UNAVAILABLE
or RESOURCE_EXHAUSTED) is left for another, up to `max_attempts` workers; once a chunk has
been forwarded, a failure ends the stream with the worker's status.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from radixmesh.client import convert
from radixmesh.errors import (
    FIELD_METADATA_KEY,
    Internal,
    InvalidArgument,
    RadixMeshError,
    Unavailable,
    entry_for,
)
from radixmesh.grpc_server import abort_rpc
from radixmesh.prefix import block_hashes
from radixmesh.router.config import RouterConfig
from radixmesh.router.metrics import RequestRecord, RouterMetrics
from radixmesh.router.policy import Policy, PolicyOptions, make_policy
from radixmesh.router.pool import WorkerHandle, WorkerPool
from radixmesh.router.programs import ProgramHint, ProgramTable
from radixmesh.tokenizer import TokenizerLike, tokenizer_for
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc, worker_pb2
from radixmesh.wire import input_ids_from_proto

logger = logging.getLogger(__name__)

# Statuses after which another worker may serve the request (nothing reached the client).
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


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
        self.requests: dict[str, WorkerHandle] = {}  # request id -> the worker serving it
        self.retries = 0
        self.programs = ProgramTable(config.program_max_queued)

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
            chosen_id = self.policy.choose(len(ids), candidates)
            self.programs.placed(hint, chosen_id)
        chosen = self.pool.workers[chosen_id]
        if chosen.block_size:
            chosen.summary.add_tentative(hashes[chosen.block_size], self.config.tentative_ttl)
            self.pool.index.enforce_budget()
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        self.metrics.decisions.labels(self.policy.name, chosen.worker_id).inc()
        return chosen, cached[chosen.worker_id]

    def _input_ids(self, inp: common_pb2.Input) -> list[int]:
        if self.tokenizer is None:
            raise Unavailable("the router is still starting")
        return input_ids_from_proto(inp, self.tokenizer)

    # ---- generate -----------------------------------------------------------------------

    async def route_and_stream(
        self,
        ids: list[int],
        params: common_pb2.SamplingParams,
        rid: str,
        *,
        stream: bool,
        hint: ProgramHint | None = None,
    ) -> AsyncGenerator[tuple[str, common_pb2.GenerateChunk], None]:
        """Route a tokenized prompt; yield (worker id, chunk) as the worker streams them.

        Both front ends (gRPC and HTTP) generate through here. Raises a `RadixMeshError`
        when no worker can be chosen, or the worker's `grpc.aio.AioRpcError` (after
        retries on other workers while nothing was yielded). Closing the generator early
        (a client that went away) cancels the worker's call, which aborts the request there.

        The worker always streams: its first chunk tells the router that the prefill is
        done (cache_aware's pending-prefill term stops counting the request then). For a
        client that asked for no stream, the chunks are joined into one here.
        """
        wreq = worker_pb2.GenerateRequest(
            input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=ids)),
            sampling_params=params,
            request_id=rid,
            stream=True,
        )
        tried: set[str] = set()
        last_error: grpc.aio.AioRpcError | None = None
        t0 = time.perf_counter()  # for the router-side latency histograms
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
                async with aclosing(self._stream_from(attempt, wreq, rid, stream)) as chunks:
                    async for chunk in chunks:
                        yield worker.worker_id, chunk
                return
            except grpc.aio.AioRpcError as e:
                if attempt.forwarded or e.code() not in _RETRYABLE:
                    raise
                logger.info("worker %s failed (%s); retrying", worker.worker_id, e.code().name)
                last_error = e
                self.retries += 1
                self.metrics.retries.inc()
        assert last_error is not None
        raise last_error

    async def _stream_from(
        self, attempt: _Attempt, wreq: worker_pb2.GenerateRequest, rid: str, stream: bool
    ) -> AsyncGenerator[common_pb2.GenerateChunk, None]:
        """One worker's Generate call: its chunks (joined into one unless `stream`), with
        the worker's load, breaker and the router's metrics kept as the call goes."""
        worker, pending = attempt.worker, attempt.pending
        started = False  # the worker streamed
        status = "CANCELLED"  # unless the stream ends or fails first
        worker.request_started(pending)  # prefill work queued there until the first chunk
        self.requests[rid] = worker
        call = worker.stub.Generate(wreq, metadata=worker.metadata)
        joined = _Joined()
        try:
            async for resp in call:
                if not started:
                    started = True
                    worker.request_streaming(pending)
                    self.metrics.ttft.observe(time.perf_counter() - attempt.started_at)
                chunk = resp.chunk
                if chunk.HasField("finish"):
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
        except grpc.aio.AioRpcError as e:
            status = e.code().name
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                worker.breaker.record_failure()
            raise
        finally:
            call.cancel()
            if not started:
                worker.request_streaming(pending)
            worker.request_ended()
            self.metrics.worker_requests.labels(worker.worker_id, status).inc()
            self.requests.pop(rid, None)

    async def Generate(
        self, request: router_pb2.RouterGenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[router_pb2.RouterGenerateResponse]:
        with self.metrics.request("grpc", "Generate") as record:
            rid = request.request_id or uuid.uuid4().hex
            try:
                ids = self._input_ids(request.input)
                hint = program_hint(request.program_id, request.shared_prefix_tokens)
                chunks = self.route_and_stream(
                    ids, request.sampling_params, rid, stream=request.stream, hint=hint
                )
                async with aclosing(chunks):
                    async for worker_id, chunk in chunks:
                        yield router_pb2.RouterGenerateResponse(chunk=chunk, worker_id=worker_id)
            except (RadixMeshError, grpc.aio.AioRpcError) as e:
                await _fail(context, e, record)

    # ---- embed --------------------------------------------------------------------------

    async def route_and_embed(
        self, ids: list[int], pooling: common_pb2.Pooling, rid: str
    ) -> tuple[str, common_pb2.Embedding]:
        """A tokenized prompt's embedding and the worker that computed it, routed and
        retried as `route_and_stream` routes and retries a generation."""
        wreq = worker_pb2.EmbedRequest(
            input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=ids)),
            pooling=pooling,
            request_id=rid,
        )
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
            self.requests[rid] = worker
            try:
                resp = await worker.stub.Embed(wreq, metadata=worker.metadata)
                worker.breaker.record_success()
                self.metrics.prompt_tokens.inc(resp.embedding.prompt_tokens)
                self.metrics.cached_tokens.inc(resp.embedding.cached_tokens)
                return worker.worker_id, resp.embedding
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    worker.breaker.record_failure()
                if e.code() not in _RETRYABLE:
                    raise
                last_error = e
                self.retries += 1
                self.metrics.retries.inc()
            finally:
                worker.request_streaming(pending)
                worker.request_ended()
                self.requests.pop(rid, None)
        assert last_error is not None
        raise last_error

    async def Embed(
        self, request: router_pb2.RouterEmbedRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterEmbedResponse:
        async def run() -> router_pb2.RouterEmbedResponse:
            ids = self._input_ids(request.input)
            rid = request.request_id or uuid.uuid4().hex
            worker_id, embedding = await self.route_and_embed(ids, request.pooling, rid)
            return router_pb2.RouterEmbedResponse(embedding=embedding, worker_id=worker_id)

        with self.metrics.request("grpc", "Embed") as record:
            return await _unary(context, run, record)

    # ---- the other RPCs -----------------------------------------------------------------

    async def Select(
        self, request: router_pb2.SelectRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.SelectResponse:
        async def run() -> router_pb2.SelectResponse:
            ids = self._input_ids(request.input)
            sreq = convert.score_request(request.input, list(request.choices))
            worker, cached = self.route(ids, set())
            worker.request_started(len(ids) - cached)
            try:
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
            return await _unary(context, run, record)

    async def Abort(
        self, request: router_pb2.RouterAbortRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterAbortResponse:
        async def run() -> router_pb2.RouterAbortResponse:
            worker = self.requests.get(request.request_id)
            if worker is None:
                return router_pb2.RouterAbortResponse(found=False)
            resp = await worker.stub.Abort(
                worker_pb2.AbortRequest(request_id=request.request_id), metadata=worker.metadata
            )
            return router_pb2.RouterAbortResponse(found=resp.found)

        return await _unary(context, run)

    async def ClusterStatus(
        self, request: router_pb2.ClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.ClusterStatusResponse:
        return router_pb2.ClusterStatusResponse(
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
            ]
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
        flushed, total = await self.flush_all()
        return router_pb2.RouterFlushCacheResponse(flushed=flushed, total=total)

    async def GetModelInfo(
        self, request: router_pb2.RouterGetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterGetModelInfoResponse:
        async def run() -> router_pb2.RouterGetModelInfoResponse:
            if self.model_info is None:
                raise Unavailable("the router is still starting")
            return router_pb2.RouterGetModelInfoResponse(info=self.model_info)

        return await _unary(context, run)


@dataclass
class _Attempt:
    """One try of a request on one worker."""

    worker: WorkerHandle
    pending: int  # the prompt tokens it has to prefill (not cached there)
    started_at: float  # perf_counter() when the request reached the router
    forwarded: bool = False  # the caller got a chunk: no retry elsewhere after this


class _Joined:
    """A worker's streamed chunks as the one chunk of a non-streaming reply: repeated
    fields (token ids, logprobs) concatenated, counts and the finish from the last chunk."""

    def __init__(self) -> None:
        self._chunk = common_pb2.GenerateChunk()
        self._text: list[str] = []

    def add(self, chunk: common_pb2.GenerateChunk) -> None:
        self._text.append(chunk.text)
        self._chunk.MergeFrom(chunk)  # appends repeated fields, overwrites set scalars

    def chunk(self) -> common_pb2.GenerateChunk:
        self._chunk.text = "".join(self._text)
        return self._chunk


MAX_PROGRAM_ID = 128


def program_hint(program_id: str, shared_prefix_tokens: int) -> ProgramHint | None:
    """A request's program hint (None without an id); a client's id is bounded."""
    if not program_id:
        return None
    if len(program_id) > MAX_PROGRAM_ID:
        raise InvalidArgument("program_id", f"at most {MAX_PROGRAM_ID} characters")
    return ProgramHint(program_id, shared_prefix_tokens)


async def _fail(
    context: grpc.aio.ServicerContext,
    e: RadixMeshError | grpc.aio.AioRpcError,
    record: RequestRecord,
) -> NoReturn:
    """End the RPC with our error's status, or a worker's as it came; record which."""
    if isinstance(e, RadixMeshError):
        record.status = entry_for(e).grpc_status
        await abort_rpc(context, e)
    record.status = e.code().name
    await _pass_on(context, e)


async def _pass_on(context: grpc.aio.ServicerContext, e: grpc.aio.AioRpcError) -> NoReturn:
    """End the RPC with a worker's status, details and field metadata, as they came."""
    field = [(k, v) for k, v in (e.trailing_metadata() or ()) if k == FIELD_METADATA_KEY]
    await context.abort(e.code(), e.details() or "", trailing_metadata=tuple(field))
    raise AssertionError("unreachable: context.abort raises")


async def _unary(
    context: grpc.aio.ServicerContext,
    run: Callable[[], Awaitable[Any]],
    record: RequestRecord | None = None,
) -> Any:
    record = record if record is not None else RequestRecord()
    try:
        return await run()
    except (RadixMeshError, grpc.aio.AioRpcError) as e:
        await _fail(context, e, record)
    except Exception as e:
        if isinstance(e, grpc.aio.AbortError):
            raise
        logger.exception("RPC failed")
        record.status = "INTERNAL"
        await abort_rpc(context, Internal(f"{type(e).__name__}: {e}"))
