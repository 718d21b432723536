"""The `radixmesh.v1.Router` servicer: the router's gRPC front end.

It turns the Router service's messages into the dispatcher's terms (dispatch.py: one
generation path for every front end) and answers the cluster's questions from the control
plane (control.py). Generate: the prompt is tokenized here (chat template for messages),
the dispatcher admits it and picks a worker, and the worker's chunks go back under the
caller's request id. Replies name the worker that served them (`worker_id`) only to an
operator (auth.Roles.operator, the rule of HTTP's X-Radixmesh-Worker header): a client
learns nothing of the cluster behind the router from its replies.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import grpc

from radixmesh.auth import ADMIN_MESSAGE
from radixmesh.client import convert
from radixmesh.errors import (
    RESUME_METADATA_KEY,
    InvalidArgument,
    PermissionDenied,
    RadixMeshError,
    Unavailable,
)
from radixmesh.grpc_server import abort_rpc, status_message
from radixmesh.router.control import ControlPlane
from radixmesh.router.dispatch import Dispatcher, StreamRef
from radixmesh.router.limits import MAX_REQUEST_ID
from radixmesh.router.metrics import RequestRecord
from radixmesh.router.programs import program_hint
from radixmesh.router.rpc import authorization, caller_of_call, fail, unary
from radixmesh.v1 import router_pb2, router_pb2_grpc

# This replica's name in ClusterStatus: replicas sharing one address are told apart by it.
ROUTER_ID = f"{socket.gethostname()}:{os.getpid()}"


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, control: ControlPlane, dispatch: Dispatcher) -> None:
        self.control = control
        self.dispatch = dispatch
        self.config = dispatch.config
        self.metrics = dispatch.metrics

    async def Generate(
        self, request: router_pb2.RouterGenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[router_pb2.RouterGenerateResponse]:
        with self.metrics.request("grpc", "Generate") as record:
            rid = request.request_id or uuid.uuid4().hex
            ref: StreamRef | None = None
            try:
                if len(rid) > MAX_REQUEST_ID:
                    raise InvalidArgument("request_id", f"at most {MAX_REQUEST_ID} characters")
                self.dispatch.rate.take(caller_of_call(context))
                top = request.sampling_params.top_logprobs_num
                self.config.limits.check_top_logprobs("sampling_params.top_logprobs_num", top)
                ids = await self.dispatch.input_ids(request.input)
                hint = program_hint(request.program_id, request.shared_prefix_tokens)
                ref = StreamRef() if request.stream else None
                shown = self._shown(context)
                chunks = self.dispatch.route_and_stream(
                    ids,
                    request.sampling_params,
                    rid,
                    stream=request.stream,
                    hint=hint,
                    caller=caller_of_call(context),
                    resumable=ref,
                )
                async with aclosing(chunks):
                    async for worker_id, chunk in chunks:
                        yield router_pb2.RouterGenerateResponse(
                            chunk=chunk,
                            worker_id=shown(worker_id),
                            stream_id=ref.stream_id if ref else "",
                            offset=chunk.completion_tokens if ref else 0,
                        )
            except (RadixMeshError, grpc.aio.AioRpcError) as e:
                if ref is not None and ref.stream_id:
                    await self._resume_elsewhere(context, record)
                await fail(context, e, record)

    async def Resume(
        self, request: router_pb2.ResumeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[router_pb2.ResumeResponse]:
        """A resumable stream after its first `offset` completion tokens, from the worker
        that holds it (any replica finds it: the id names the worker)."""
        with self.metrics.request("grpc", "Resume") as record:
            try:
                self.dispatch.rate.take(caller_of_call(context))
                shown = self._shown(context)
                chunks = self.dispatch.resume(
                    request.stream_id, request.offset, caller_of_call(context)
                )
                async with aclosing(chunks):
                    async for worker_id, chunk in chunks:
                        yield router_pb2.ResumeResponse(
                            chunk=chunk,
                            worker_id=shown(worker_id),
                            stream_id=request.stream_id,
                            offset=chunk.completion_tokens,
                        )
            except (RadixMeshError, grpc.aio.AioRpcError) as e:
                await self._resume_elsewhere(context, record)
                await fail(context, e, record)

    async def _resume_elsewhere(
        self, context: grpc.aio.ServicerContext, record: RequestRecord
    ) -> None:
        """While this router shuts down, end a resumable stream with UNAVAILABLE that says
        to resume it (its worker holds it: dispatch.py sends no Abort then)."""
        stopping = self.dispatch.streams.stopping
        if stopping is None:
            return
        record.status = "UNAVAILABLE"
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            status_message(stopping),
            trailing_metadata=((RESUME_METADATA_KEY, "1"),),
        )

    async def Embed(
        self, request: router_pb2.RouterEmbedRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterEmbedResponse:
        async def run() -> router_pb2.RouterEmbedResponse:
            self.dispatch.rate.take(caller_of_call(context))
            ids = await self.dispatch.input_ids(request.input)
            rid = request.request_id or uuid.uuid4().hex
            worker_id, embedding = await self.dispatch.route_and_embed(
                ids, request.pooling, rid, caller_of_call(context)
            )
            return router_pb2.RouterEmbedResponse(
                embedding=embedding, worker_id=self._shown(context)(worker_id)
            )

        with self.metrics.request("grpc", "Embed") as record:
            return await unary(context, run, record)

    async def Select(
        self, request: router_pb2.SelectRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.SelectResponse:
        async def run() -> router_pb2.SelectResponse:
            self.dispatch.rate.take(caller_of_call(context))
            if len(request.choices) > self.config.max_choices:
                raise InvalidArgument(
                    "choices", f"at most {self.config.max_choices}, got {len(request.choices)}"
                )
            ids = await self.dispatch.input_ids(request.input)
            sreq = convert.score_request(request.input, list(request.choices))
            resp = await self.dispatch.score(ids, sreq)
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
            found = await self.dispatch.abort(request.request_id, me, anyone)
            return router_pb2.RouterAbortResponse(found=found)

        return await unary(context, run)

    def _shown(self, context: grpc.aio.ServicerContext) -> Callable[[str], str]:
        """What a reply's `worker_id` is for this caller: the worker's id to an operator,
        else empty (decided once per call: the key does not change within it)."""
        if self.config.roles.operator(authorization(context)):
            return _as_is
        return _hidden

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
                for w in self.control.pool.workers.values()
            ],
        )

    async def FlushCache(
        self, request: router_pb2.RouterFlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterFlushCacheResponse:
        await self._require_admin(context)
        flushed, total = await self.control.flush_all()
        return router_pb2.RouterFlushCacheResponse(flushed=flushed, total=total)

    async def GetModelInfo(
        self, request: router_pb2.RouterGetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> router_pb2.RouterGetModelInfoResponse:
        async def run() -> router_pb2.RouterGetModelInfoResponse:
            if self.control.model_info is None:
                raise Unavailable("the router is still starting")
            return router_pb2.RouterGetModelInfoResponse(info=self.control.model_info)

        return await unary(context, run)


def _as_is(worker_id: str) -> str:
    return worker_id


def _hidden(worker_id: str) -> str:
    return ""
