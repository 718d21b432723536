"""The router's HTTP API (aiohttp, on the router's own event loop): OpenAI's and SGLang's.

Endpoints: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (SSE when
`stream`), `GET /health`, `GET /metrics`, and SGLang's native API (`/generate`,
`/get_model_info`, ...: sglang_api.py). Generation goes through the gRPC servicer's
`route_and_stream`, the one routing / retry / proxy path of the router; this module only
parses OpenAI requests and formats replies (openai_protocol.py).

Errors use OpenAI's layout `{"error": {"message", "type", "param", "code"}}` with the
catalogue's HTTP status (400 naming the field as `param`, 401, 404, 429, 503). An error
after a stream started is sent as one `data: {"error": ...}` event before `[DONE]`.
A client that disconnects cancels its handler (`handler_cancellation`), which closes the
worker call: the worker aborts the request and frees its KV.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import grpc
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from radixmesh.auth import bearer_allowed
from radixmesh.client.convert import error_from_rpc
from radixmesh.errors import CATALOGUE, InvalidArgument, RadixMeshError, Unavailable, entry_for
from radixmesh.router.config import RouterConfig
from radixmesh.router.openai_protocol import (
    OpenAIRequest,
    Usage,
    choice_json,
    envelope,
    finish_reason,
    logprobs_json,
    openai_field,
    parse_request,
)
from radixmesh.router.programs import ProgramHint
from radixmesh.router.service import RouterServicer
from radixmesh.tokenizer import TokenizerLike
from radixmesh.v1 import common_pb2

logger = logging.getLogger(__name__)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}
# HTTP status -> the gRPC status name requests are counted under (metrics.py).
_STATUS_NAMES = {200: "OK", 404: "NOT_FOUND", 405: "UNIMPLEMENTED"} | {
    e.http_status: e.grpc_status for e in CATALOGUE
}
_STATUS_KEY = "radixmesh_status"  # request key: a status that the HTTP status does not show

# (choice or output index, serving worker id, chunk)
Chunks = AsyncGenerator[tuple[int, str, common_pb2.GenerateChunk], None]
JobChunks = Chunks
# (output index, token ids, sampling parameters)
Job = tuple[int, list[int], common_pb2.SamplingParams]
# Names the worker that served a single-choice request (benchmarks and debugging read it).
WORKER_HEADER = "X-Radixmesh-Worker"
_OPEN_PATHS = ("/health", "/metrics")  # probes and scrapers: no API key, no request metrics


class ApiError(Exception):
    """An error reply: HTTP status, message, the offending field and a short code."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @classmethod
    def from_exception(cls, e: BaseException) -> ApiError:
        if isinstance(e, grpc.aio.AioRpcError):
            e = error_from_rpc(e)
        entry = entry_for(e)
        if isinstance(e, InvalidArgument):
            return cls(entry.http_status, e.message, openai_field(e.field), "invalid_argument")
        return cls(entry.http_status, str(e), None, entry.grpc_status.lower())

    def to_json(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": _ERROR_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.to_json(), status=self.status)


def ssl_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca:  # mutual TLS: clients must present a certificate this CA signed
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class HttpFrontend:
    def __init__(
        self, servicer: RouterServicer, config: RouterConfig, grpc_port: int | None = None
    ) -> None:
        self.servicer = servicer
        self.config = config
        self.metrics = servicer.metrics
        self.grpc_port = grpc_port  # the router's gRPC port (SGLang clients read it)
        self.started = int(time.time())
        self._runner: web.AppRunner | None = None

    # ---- the server -------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_text)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        from radixmesh.router.sglang_api import SglangApi

        SglangApi(self).register(app)
        return app

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (TLS when configured). Returns the bound port."""
        c = self.config
        context = None
        if c.tls_cert and c.tls_key:
            context = ssl_context(c.tls_cert, c.tls_key, c.tls_client_ca)
        # handler_cancellation: a disconnected client cancels its handler (and the worker call).
        runner = web.AppRunner(self.build_app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=context, shutdown_timeout=1.0)
        await site.start()
        self._runner = runner
        return int(runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in _OPEN_PATHS:
            return await self._answer(request, handler)
        route = request.match_info.route.resource
        endpoint = route.canonical if route is not None else "other"
        with self.metrics.request("http", endpoint) as record:
            if not bearer_allowed(request.headers.get("Authorization"), self.config.api_keys):
                resp: web.StreamResponse = ApiError(
                    401, "missing or wrong API key (send `Authorization: Bearer <key>`)",
                    None, "invalid_api_key",
                ).response()  # fmt: skip
            else:
                try:
                    resp = await self._answer(request, handler)
                except ConnectionResetError:
                    record.status = "CANCELLED"
                    raise
            record.status = request.get(_STATUS_KEY) or _STATUS_NAMES.get(resp.status, "UNKNOWN")
            return resp

    async def _answer(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as e:
            return e.response()
        except web.HTTPNotFound:
            return ApiError(404, f"no route {request.path}", None, "not_found").response()
        except web.HTTPMethodNotAllowed:
            message = f"{request.method} is not allowed on {request.path}"
            return ApiError(405, message, None, "method_not_allowed").response()
        except (RadixMeshError, ValueError, grpc.aio.AioRpcError) as e:
            return ApiError.from_exception(e).response()

    # ---- plain endpoints ---------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        healthy = sum(w.healthy for w in self.servicer.pool.workers.values())
        if self.servicer.model_info is None or not healthy:
            raise ApiError(503, "no healthy worker", None, "unavailable")
        return web.json_response({"status": "ok", "healthy_workers": healthy})

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    def _model_json(self) -> dict[str, Any]:
        info = self._ready()[1]
        return {
            "id": info.model,
            "object": "model",
            "created": self.started,
            "owned_by": "radixmesh",
            "max_model_len": info.context_length,
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_json()]})

    async def model(self, request: web.Request) -> web.Response:
        self._check_model(request.match_info["model"])
        return web.json_response(self._model_json())

    def _ready(self) -> tuple[TokenizerLike, common_pb2.ModelInfo]:
        tok, info = self.servicer.tokenizer, self.servicer.model_info
        if tok is None or info is None:
            raise Unavailable("the router is still starting (no worker has answered yet)")
        return tok, info

    def _check_model(self, name: str) -> None:
        served = self._ready()[1].model
        if name != served:
            message = f"the model {name!r} does not exist; this router serves {served!r}"
            raise ApiError(404, message, "model", "model_not_found")

    # ---- generation --------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        tok, info = self._ready()
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the body is not valid JSON: {e}", None, "invalid_json") from None
        req = parse_request(body, chat=chat, tokenizer=tok, context_length=info.context_length)
        self._check_model(req.model)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        chunks = self._choices(req, rid)
        async with aclosing(chunks):
            if req.stream:
                return await self._stream(request, req, rid, chunks, tok)
            return await self._collect(req, rid, chunks, tok)

    async def _choices(self, req: OpenAIRequest, rid: str) -> Chunks:
        """Every choice's chunks as (choice index, worker id, chunk), generated at once."""
        jobs = [
            (i * req.n + j, ids, req.params[j])
            for i, ids in enumerate(req.prompts)
            for j in range(req.n)
        ]
        chunks = self.stream_jobs(jobs, rid, stream=req.stream)
        async with aclosing(chunks):
            async for item in chunks:
                yield item

    async def stream_jobs(
        self,
        jobs: list[Job],
        rid: str,
        *,
        stream: bool,
        rids: list[str] | None = None,
        hint: ProgramHint | None = None,
    ) -> JobChunks:
        """Every job's chunks as (index, worker id, chunk), the jobs generated at once.
        Request ids: `rids[index]`, else `rid` (one job) or `rid-index`. `hint`: the
        program they all belong to."""

        def route(
            ids: list[int], params: common_pb2.SamplingParams, rid: str, *, stream: bool
        ) -> AsyncGenerator[tuple[str, common_pb2.GenerateChunk], None]:
            return self.servicer.route_and_stream(ids, params, rid, stream=stream, hint=hint)

        def rid_of(index: int) -> str:
            if rids is not None:
                return rids[index]
            return rid if len(jobs) == 1 else f"{rid}-{index}"

        if len(jobs) == 1:  # no tasks needed
            index, ids, params = jobs[0]
            chunks = route(ids, params, rid_of(index), stream=stream)
            async with aclosing(chunks):
                async for worker, chunk in chunks:
                    yield index, worker, chunk
            return
        Item = tuple[int, str, common_pb2.GenerateChunk | None, BaseException | None]
        queue: asyncio.Queue[Item] = asyncio.Queue()

        async def pump(index: int, ids: list[int], params: common_pb2.SamplingParams) -> None:
            try:
                chunks = route(ids, params, rid_of(index), stream=stream)
                async with aclosing(chunks):
                    async for worker, chunk in chunks:
                        queue.put_nowait((index, worker, chunk, None))
                queue.put_nowait((index, "", None, None))
            except Exception as e:
                queue.put_nowait((index, "", None, e))

        tasks = [asyncio.create_task(pump(*job)) for job in jobs]
        try:
            remaining = len(tasks)
            while remaining:
                index, worker, got, error = await queue.get()
                if error is not None:
                    raise error
                if got is None:
                    remaining -= 1
                else:
                    yield index, worker, got
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _collect(
        self, req: OpenAIRequest, rid: str, chunks: Chunks, tok: TokenizerLike
    ) -> web.Response:
        total = len(req.prompts) * req.n
        texts = [""] * total
        reasons: list[str | None] = [None] * total
        logprobs: list[dict[str, Any] | None] = [None] * total
        usage = Usage()
        workers: set[str] = set()
        async for index, worker, chunk in chunks:
            workers.add(worker)
            if req.top_logprobs is not None:
                lp = logprobs_json(chunk, tok, chat=req.chat, offset=len(texts[index]))
                logprobs[index] = _join_logprobs(logprobs[index], lp)
            texts[index] += chunk.text
            if chunk.HasField("finish"):
                reasons[index] = finish_reason(chunk)
                usage.add(chunk, first_choice=index % req.n == 0)
        body = envelope(req, rid, chunk=False)
        body["choices"] = [
            choice_json(req, i, texts[i], reasons[i], logprobs[i], delta=False)
            for i in range(total)
        ]
        body["usage"] = usage.to_json()
        return web.json_response(body, headers={WORKER_HEADER: ",".join(sorted(workers))})

    async def _stream(
        self,
        request: web.Request,
        req: OpenAIRequest,
        rid: str,
        chunks: Chunks,
        tok: TokenizerLike,
    ) -> web.StreamResponse:
        # Wait for the first chunk before the 200: errors until then get their own status.
        item = await anext(chunks, None)
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        if item is not None and len(req.prompts) * req.n == 1:
            headers[WORKER_HEADER] = item[1]
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        base = envelope(req, rid, chunk=True)
        if req.include_usage:
            base["usage"] = None

        async def send(payload: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

        if req.chat:  # OpenAI opens each chat choice with the role
            for i in range(len(req.prompts) * req.n):
                choice = choice_json(req, i, "", None, None, delta=True)
                choice["delta"] = {"role": "assistant", "content": ""}
                await send({**base, "choices": [choice]})
        offsets = [0] * (len(req.prompts) * req.n)
        usage = Usage()
        try:
            while item is not None:
                index, _, chunk = item
                lp = None
                if req.top_logprobs is not None:
                    lp = logprobs_json(chunk, tok, chat=req.chat, offset=offsets[index])
                offsets[index] += len(chunk.text)
                reason = finish_reason(chunk)
                if reason is not None:
                    usage.add(chunk, first_choice=index % req.n == 0)
                if req.continuous_usage and (chunk.token_ids or reason is not None):
                    choice = choice_json(req, index, chunk.text, reason, lp, delta=True)
                    usage_now = Usage.of_chunk(chunk).to_json()
                    await send({**base, "choices": [choice], "usage": usage_now})
                elif chunk.text or reason is not None:
                    choice = choice_json(req, index, chunk.text, reason, lp, delta=True)
                    await send({**base, "choices": [choice]})
                item = await anext(chunks, None)
        except (RadixMeshError, grpc.aio.AioRpcError) as e:
            error = ApiError.from_exception(e)
            request[_STATUS_KEY] = _STATUS_NAMES.get(error.status, "UNKNOWN")
            await send(error.to_json())
        if req.include_usage:
            await send({**base, "choices": [], "usage": usage.to_json()})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _join_logprobs(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    if a is None:
        return b
    return {k: a[k] + b[k] for k in b}
