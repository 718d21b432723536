"""The router's HTTP server (aiohttp, on the router's own event loop): OpenAI's API, Anthropic's
Messages API and SGLang's.

`GET /health` and `GET /metrics` are served here (the metrics, and the
`X-Radixmesh-Worker` header naming the worker that served a reply, only to an admin key
where there are keys: `operator`); the OpenAI-compatible API (`/v1/...`,
`/tokenize`, `/detokenize`, `/openapi.json`: openai/routes.py; `/v1/responses`:
openai/responses_api/), Anthropic's `/v1/messages` (anthropic/routes.py) and SGLang's
native API (`/generate`, `/get_model_info`, ...: sglang_api.py) register their routes.
Generation goes through `stream_jobs`, over the dispatcher's `route_and_stream` (dispatch.py),
the one routing / retry / proxy path of the router, shared with the gRPC front end.

Errors use OpenAI's layout `{"error": {"message", "type", "param", "code"}}` with the
catalogue's HTTP status (400 naming the field as `param`, 401, 404, 429, 503; see
api_error.py); on the Messages API's paths, and on `/v1/models` asked by Anthropic's
clients (`anthropic_models`), they are Anthropic's (anthropic/routes.py), the
middleware's 401 and 429 too, and the key may come as `x-api-key`. An error after a
stream started is sent as one `data: {"error": ...}` event before `[DONE]` (the Messages
and Responses APIs: one `event: error`). A client that disconnects cancels its handler
(`handler_cancellation`), which closes the worker call: the worker aborts the request and
frees its KV.

Connections go through the listener's guard (http_listener.py: connection caps, the
request head's timeout); the body is read here, within its timeout, before a handler
runs; a connection idle between requests is closed by aiohttp (`keepalive_timeout`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import grpc
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from radixmesh.auth import bearer_allowed, caller_of
from radixmesh.errors import InvalidArgument, Overloaded, RadixMeshError, Unavailable
from radixmesh.listener import AcceptErrors, Tally, connection_cap, descriptor_limit
from radixmesh.router.config import RouterConfig
from radixmesh.router.control import ControlPlane
from radixmesh.router.dispatch import Dispatcher
from radixmesh.router.http.anthropic.routes import (
    AnthropicRoutes,
    anthropic_error,
    authorization,
    is_anthropic,
)
from radixmesh.router.http.api_error import STATUS_KEY, STATUS_NAMES, ApiError, json_errors
from radixmesh.router.http.frontend import Job, JobChunks
from radixmesh.router.http.listener import ConnectionGuard, GuardedSite, ServerLog
from radixmesh.router.http.model_identity import anthropic_model, openai_model
from radixmesh.router.http.openai.generation import WORKER_HEADER
from radixmesh.router.http.openai.responses_api.routes import ResponsesRoutes
from radixmesh.router.http.openai.routes import OpenAIRoutes
from radixmesh.router.programs import ProgramHint
from radixmesh.tokenizer import TokenizerLike
from radixmesh.v1 import common_pb2

logger = logging.getLogger(__name__)

__all__ = ["ApiError", "HttpFrontend", "JobChunks", "ssl_context"]

# Probes, scrapers and the API's description: no API key, no request metrics (`/metrics`
# checks its own: `operator`).
_OPEN_PATHS = ("/health", "/metrics", "/openapi.json", "/ping", "/ready")


def anthropic_models(request: web.Request) -> bool:
    """Whether a `/v1/models` request is Anthropic's: its clients send `anthropic-version`
    on every call (OpenAI's never do), and get Anthropic's model objects and errors."""
    return request.path.startswith("/v1/models") and "anthropic-version" in request.headers


def ssl_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca:  # mutual TLS: clients must present a certificate this CA signed
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class HttpFrontend:
    def __init__(
        self,
        dispatch: Dispatcher,
        control: ControlPlane,
        config: RouterConfig,
        grpc_port: int | None = None,
    ) -> None:
        self.dispatch = dispatch
        self.control = control
        self.config = config
        self.metrics = dispatch.metrics
        self.grpc_port = grpc_port  # the router's gRPC port (SGLang clients read it)
        self.started = int(time.time())
        self._runner: web.AppRunner | None = None
        self.guard: ConnectionGuard | None = None  # once started

    # ---- the server -------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._middleware], client_max_size=self.config.max_body_bytes
        )
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_text)
        app.on_response_prepare.append(self._worker_identity)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        OpenAIRoutes(self).register(app)
        AnthropicRoutes(self).register(app)
        ResponsesRoutes(self).register(app)
        from radixmesh.router.http.sglang_api import SglangApi

        SglangApi(self).register(app)
        return app

    async def start(self, host: str, port: int, max_connections: int | None = None) -> int:
        """Listen on host:port (TLS when configured) behind the connection guard
        (http_listener.py: at most `max_connections` open, default: this port's share of
        the descriptor limit; the configured timeouts). Returns the bound port."""
        c = self.config
        limits = c.listener_limits
        if max_connections is None:
            max_connections = connection_cap(limits, 1, descriptor_limit())
        context = None
        if c.tls_cert and c.tls_key:
            context = ssl_context(c.tls_cert, c.tls_key, c.tls_client_ca)
        # handler_cancellation: a disconnected client cancels its handler (and the worker
        # call); keepalive_timeout: a connection without a request in flight for that long
        # is closed (also one that never sent a byte: aiohttp times it from the start);
        # logger: its errors (a malformed request's among them) at a bounded rate.
        tally = Tally(f"HTTP port {port}")
        runner = web.AppRunner(
            self.build_app(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=1.0,
            keepalive_timeout=limits.idle_timeout,
            logger=ServerLog(tally),
        )
        await runner.setup()
        assert runner.server is not None
        keyed = bool(c.caller_keys)
        self.guard = ConnectionGuard(
            limits, max_connections, json_errors(runner.server), tally, context, keyed=keyed
        )
        site = GuardedSite(runner, host, port, self.guard)
        await site.start()
        self._runner = runner
        bound = int(runner.addresses[0][1])
        tally.name = f"HTTP port {bound}"
        AcceptErrors(tally).install(asyncio.get_running_loop())
        return bound

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self.guard is not None:
            self.guard.tally.close()  # what it counted since its last line

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.guard is None:  # an app served by someone else (tests)
            return await self._handle(request, handler)
        with self.guard.request(request.transport):  # the head arrived: its timer stops
            resp = await self._handle(request, handler)
        if self.guard.closing(request.transport):  # a keyless connection's last response
            resp.force_close()
        return resp

    async def _handle(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        # Anthropic's API: its errors in its layout, its key also as `x-api-key`.
        anthropic = is_anthropic(request.path) or anthropic_models(request)
        render = anthropic_error if anthropic else ApiError.response
        if request.path in _OPEN_PATHS:
            return await self._answer(request, handler, render)
        route = request.match_info.route.resource
        endpoint = route.canonical if route is not None else "other"
        key = authorization(request) if anthropic else request.headers.get("Authorization")
        allowed = bearer_allowed(key, self.config.caller_keys)
        if self.guard is not None:
            self.guard.outcome(request.transport, allowed)
        with self.metrics.request("http", endpoint) as record:
            if not allowed:
                how = "`x-api-key: <key>` or " if anthropic else ""
                resp: web.StreamResponse = render(ApiError(
                    401, f"missing or wrong API key (send {how}`Authorization: Bearer <key>`)",
                    None, "invalid_api_key",
                ))  # fmt: skip
            else:
                try:
                    if request.method == "POST":  # the API's work: each call takes a token
                        self.dispatch.rate.take(caller_of(key))
                    resp = await self._answer(request, handler, render)
                except Overloaded as e:
                    resp = render(ApiError.from_exception(e))
                except ConnectionResetError:
                    record.status = "CANCELLED"
                    raise
            record.status = request.get(STATUS_KEY) or STATUS_NAMES.get(resp.status, "UNKNOWN")
            return resp

    async def _answer(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        render: Callable[[ApiError], web.Response],
    ) -> web.StreamResponse:
        try:
            if request.body_exists and (late := await self._read_body(request)) is not None:
                return late
            return await handler(request)
        except ApiError as e:
            return render(e)
        except web.HTTPNotFound:
            return render(ApiError(404, f"no route {request.path}", None, "not_found"))
        except web.HTTPMethodNotAllowed:
            message = f"{request.method} is not allowed on {request.path}"
            return render(ApiError(405, message, None, "method_not_allowed"))
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.max_body_bytes
            message = f"the body is larger than {limit} bytes"
            return render(ApiError(413, message, None, "request_too_large"))
        except (RadixMeshError, ValueError, grpc.aio.AioRpcError) as e:
            return render(ApiError.from_exception(e))
        except web.HTTPException:
            raise
        except Exception:
            # A bug, not the client's fault: logged with its traceback, answered in the
            # API's JSON layout (aiohttp's own 500 is plain text no client parses).
            logger.exception("%s %s failed", request.method, request.path)
            return render(ApiError(500, "internal error", None, "internal_error"))

    async def _read_body(self, request: web.Request) -> web.StreamResponse | None:
        """Read the body (aiohttp keeps it for the handler's `read`) within `body_timeout`
        seconds of the head. A client that trickles it gets a 408 and the connection is
        closed at once (not kept for aiohttp's lingering read of the rest); the 408 is
        returned, already sent. A client gone before its body ended is answered nothing
        (aiohttp drops a reply to a closed connection quietly; an exception would be a
        logged traceback per disconnection)."""
        timeout = self.config.body_timeout
        try:
            await asyncio.wait_for(request.read(), timeout)
            return None
        except ConnectionResetError:
            request[STATUS_KEY] = "CANCELLED"
            return ApiError(400, "the client left before its body ended").response()
        except TimeoutError:
            pass
        if self.guard is not None:
            self.guard.tally.add("closed at body_timeout")
        message = f"the body did not arrive within {timeout:g} s of the head"
        resp = ApiError(408, message, None, "request_timeout").response()
        resp.force_close()
        try:
            await resp.prepare(request)
            await resp.write_eof()
        except ConnectionError:  # the client left meanwhile
            return resp
        if request.transport is not None:
            request.transport.close()  # after the 408 is flushed
        return resp

    # ---- plain endpoints ---------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        healthy = self.control.healthy_workers()
        if self.dispatch.admission.closed is not None:
            raise ApiError(503, self.dispatch.admission.closed, None, "unavailable")
        if self.control.model_info is None or not healthy:
            raise ApiError(503, "no healthy worker", None, "unavailable")
        return web.json_response({"status": "ok", "healthy_workers": healthy})

    def operator(self, request: web.Request) -> bool:
        """Whether the caller may see the router's internals on this port: `/metrics` and
        which worker served a reply (`X-Radixmesh-Worker`). With admin keys, an admin key;
        with API keys alone, nobody (the metrics port serves the metrics; the operator named
        no admin); with no keys at all (a local cluster, the demo), everybody: auth.Roles'
        `operator`, as for gRPC's `worker_id`."""
        return self.config.roles.operator(authorization(request))

    async def _worker_identity(self, request: web.Request, response: web.StreamResponse) -> None:
        """Before a reply's headers go out: the serving worker's name only to an operator
        (a client learns nothing of the cluster behind the router from its replies)."""
        if WORKER_HEADER in response.headers and not self.operator(request):
            del response.headers[WORKER_HEADER]

    async def metrics_text(self, request: web.Request) -> web.Response:
        if not self.operator(request):
            if not bearer_allowed(authorization(request), self.config.caller_keys):
                raise ApiError(401, "missing or wrong admin key", None, "invalid_api_key")
            raise ApiError(
                403, "the metrics are the admin keys' (or the --metrics-port's)", None, "forbidden"
            )
        return web.Response(
            body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def models(self, request: web.Request) -> web.Response:
        """The served model in a list: OpenAI's, or Anthropic's page when the request is
        Anthropic's (`anthropic_models`). Anthropic's `after_id` / `before_id` find
        nothing past the only model; `limit` is checked (1 to 1000, its range)."""
        info = self.ready()[1]
        if not anthropic_models(request):
            return web.json_response({"object": "list", "data": [openai_model(info, self.started)]})
        limit = request.query.get("limit", "20")
        if not limit.isdigit() or not 1 <= int(limit) <= 1000:
            raise InvalidArgument("limit", f"must be an integer from 1 to 1000, got {limit!r:.32}")
        past = "after_id" in request.query or "before_id" in request.query
        data: list[dict[str, Any]] = [] if past else [anthropic_model(info)]
        first = None if past else info.model
        page = {"data": data, "has_more": False, "first_id": first, "last_id": first}
        return web.json_response(page)

    async def model(self, request: web.Request) -> web.Response:
        self.check_model(request.match_info["model"])
        info = self.ready()[1]
        if anthropic_models(request):
            return web.json_response(anthropic_model(info))
        return web.json_response(openai_model(info, self.started))

    def ready(self) -> tuple[TokenizerLike, common_pb2.ModelInfo]:
        tok, info = self.control.tokenizer, self.control.model_info
        if tok is None or info is None:
            raise Unavailable("the router is still starting (no worker has answered yet)")
        return tok, info

    def check_model(self, name: str) -> None:
        served = self.ready()[1].model
        if name != served:
            message = f"the model {name!r} does not exist; this router serves {served!r}"
            raise ApiError(404, message, "model", "model_not_found")

    # ---- generation --------------------------------------------------------------------

    async def stream_jobs(
        self,
        jobs: list[Job],
        rid: str,
        *,
        stream: bool,
        rids: list[str] | None = None,
        hint: ProgramHint | None = None,
        caller: str = "",
    ) -> JobChunks:
        """Every job's chunks as (index, worker id, chunk), the jobs generated at once.
        Request ids: `rids[index]`, else `rid` (one job) or `rid-index`, the caller's
        (`caller`: auth.caller_of its key). `hint`: the program they all belong to."""

        def route(
            ids: list[int], params: common_pb2.SamplingParams, rid: str, *, stream: bool
        ) -> AsyncGenerator[tuple[str, common_pb2.GenerateChunk], None]:
            return self.dispatch.route_and_stream(
                ids, params, rid, stream=stream, hint=hint, caller=caller
            )

        def rid_of(index: int) -> str:
            if rids is not None:
                return rids[index]
            return rid if len(jobs) == 1 else f"{rid}-{index}"

        streams = [
            (index, route(ids, params, rid_of(index), stream=stream)) for index, ids, params in jobs
        ]
        merged = _merged(streams)
        async with aclosing(merged):
            async for item in merged:
                yield item


async def _merged(
    streams: list[tuple[int, AsyncGenerator[tuple[str, common_pb2.GenerateChunk], None]]],
) -> JobChunks:
    """The streams' chunks as (index, worker id, chunk), as they come; one stream is read
    in place, several by a task each. The first error ends them all."""
    if len(streams) == 1:  # no tasks needed
        index, chunks = streams[0]
        async with aclosing(chunks):
            async for worker, chunk in chunks:
                yield index, worker, chunk
        return
    Item = tuple[int, str, common_pb2.GenerateChunk | None, BaseException | None]
    queue: asyncio.Queue[Item] = asyncio.Queue()

    async def pump(
        index: int, chunks: AsyncGenerator[tuple[str, common_pb2.GenerateChunk], None]
    ) -> None:
        try:
            async with aclosing(chunks):
                async for worker, chunk in chunks:
                    queue.put_nowait((index, worker, chunk, None))
            queue.put_nowait((index, "", None, None))
        except Exception as e:
            queue.put_nowait((index, "", None, e))

    tasks = [asyncio.create_task(pump(index, chunks)) for index, chunks in streams]
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
