"""SGLang's native HTTP API on the router, beside OpenAI's (http.py).

`POST /generate` (text or input_ids, one prompt or a batch, SGLang's `sampling_params`,
streaming as SGLang's SSE events with the text so far), `GET /get_model_info` and
`/model_info`, `GET /get_server_info` and `/server_info` (with the router's gRPC port, so a
client given this URL can speak gRPC; the workers only for an admin), `GET|POST
/flush_cache` (every worker; an admin's), `POST /abort_request` (the caller's own request,
or an admin's reach: auth.Roles), `GET /health_generate` (one token through the router),
`POST /concate_and_append_request` (acknowledged: see `concate_and_append`), the probes
`GET /ping` (SageMaker's) and `GET /ready` (200 once serving, else 503 with Retry-After;
both open like /health: http.py), vLLM's `POST /reset_prefix_cache` (as /flush_cache),
`/start_profile` and `/stop_profile` (501: no profiler runs here), and the scoring
routes: SGLang's `/v1/score` and `/v1/rerank`, vLLM's and Cohere's `/score`, `/rerank`
and `/v2/rerank` (score_api.py). Generation runs through the same `route_and_stream` as
every other front end; parsing and reply shapes are sglang_protocol.py's. Errors: the
HTTP frontend's `{"error": {...}}` with status 400 / 503.

A stream of one output is resumable (router/dispatch.py): its events have SSE ids
("<stream id>/<completion tokens so far>"); the same request sent again with
`Last-Event-ID` (to any router) continues it. Each event carries the whole text so far,
so a resumed stream restarts from the worker's first output: its first event has the
text up to now, as the next event would have had.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import grpc
from aiohttp import web

from radixmesh.auth import ADMIN_MESSAGE, caller_of
from radixmesh.client.convert import error_from_rpc
from radixmesh.errors import InvalidArgument, PermissionDenied, RadixMeshError
from radixmesh.router.dispatch import StreamRef
from radixmesh.router.http import model_identity
from radixmesh.router.http.api_error import ApiError, read_json, retry_after_header
from radixmesh.router.http.openai.generation import ROUTER_HEADER, event_id, parse_event_id
from radixmesh.router.http.score_api import ScoreApi
from radixmesh.router.http.sglang_protocol import (
    GenerateRequest,
    OutputState,
    parse_generate,
    sglang_field,
)
from radixmesh.router.limits import MAX_REQUEST_ID
from radixmesh.router.liveness import UNAVAILABLE_RETRY_AFTER
from radixmesh.router.service import ROUTER_ID
from radixmesh.v1 import common_pb2
from radixmesh.version import __version__

if TYPE_CHECKING:
    from radixmesh.router.http.frontend import Frontend, JobChunks

HEALTH_TIMEOUT = 20.0  # seconds /health_generate waits for its token


class SglangApi:
    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend

    def register(self, app: web.Application) -> None:
        app.router.add_route("POST", "/generate", self.generate)
        app.router.add_route("PUT", "/generate", self.generate)
        for path in ("/get_model_info", "/model_info"):
            app.router.add_get(path, self.model_info)
        for path in ("/get_server_info", "/server_info"):
            app.router.add_get(path, self.server_info)
        app.router.add_route("GET", "/flush_cache", self.flush_cache)
        app.router.add_route("POST", "/flush_cache", self.flush_cache)
        app.router.add_post("/abort_request", self.abort_request)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_post("/concate_and_append_request", self.concate_and_append)
        app.router.add_get("/ping", self.ready)
        app.router.add_get("/ready", self.ready)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        for path in ("/start_profile", "/stop_profile"):
            app.router.add_route("GET", path, self.profile)
            app.router.add_route("POST", path, self.profile)
        ScoreApi(self.frontend).register(app)

    # ---- probes ---------------------------------------------------------------------------

    async def ready(self, request: web.Request) -> web.Response:
        """SGLang's `/ready` and `/ping`: an empty 200 while the router serves (a worker
        has answered, one is healthy, no drain), else an empty 503 with Retry-After.
        SGLang's differ only while it pauses for a weight update, which radixmesh has not."""
        frontend = self.frontend
        serving = (
            frontend.dispatch.admission.closed is None
            and frontend.control.model_info is not None
            and bool(frontend.control.healthy_workers())
        )
        if serving:
            return web.Response(status=200)
        return web.Response(status=503, headers=retry_after_header(UNAVAILABLE_RETRY_AFTER))

    async def profile(self, request: web.Request) -> web.Response:
        """SGLang's profiler switches: radixmesh has no profiler to start, so a 501 that
        says so (a 200 would have a client wait for a trace that never comes)."""
        message = (
            f"{request.path}: no profiler runs in this server; profile a worker process "
            "with py-spy or torch.profiler in an Engine (docs/performance.md)"
        )
        raise ApiError(501, message, None, "unimplemented")

    # ---- information ----------------------------------------------------------------------

    async def model_info(self, request: web.Request) -> web.Response:
        """SGLang's fields; `model_path` and `tokenizer_path` are the weights' identity,
        `chat_template` the template's family. SGLang's frontend alone gets `model_path`
        with the note its template patterns read (model_identity.py)."""
        info = self.frontend.ready()[1]
        source = model_identity.identity(info.tokenizer or info.model)
        template = model_identity.template_name(info.chat_template)
        model_path = source
        if model_identity.is_sglang_frontend(request.headers):
            model_path = model_identity.sglang_model_path(source, template)
        return web.json_response(
            {
                "model_path": model_path,
                "served_model_name": info.model,
                "tokenizer_path": source,
                "chat_template": template,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "context_length": info.context_length,
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        """The model, the policy, the version and the gRPC port for every caller (SGLang's
        client reads `grpc_port`); the workers' addresses, health and load
        (`internal_states`) only for an admin, as ClusterStatus: for anyone else an empty
        list, so that clients indexing it get nothing rather than a missing key."""
        info = self.frontend.ready()[1]
        config = self.frontend.config
        admin = config.roles.admin(request.headers.get("Authorization"))
        workers = [
            {
                "worker_id": w.worker_id,
                "address": w.address,
                "healthy": w.healthy,
                "num_running": w.load.num_running,
                "num_waiting": w.load.num_waiting,
                "kv_tokens_used": w.load.kv_tokens_used,
                "kv_tokens_total": w.load.kv_tokens_total,
            }
            for w in self.frontend.control.pool.workers.values()
            if admin
        ]
        return web.json_response(
            {
                "model_path": info.model,
                "tokenizer_path": info.tokenizer,
                "context_length": info.context_length,
                "page_size": info.page_size,
                "version": __version__,
                "grpc_port": self.frontend.grpc_port,
                "policy": config.policy,
                "internal_states": workers,
            }
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        if not self.frontend.config.roles.admin(request.headers.get("Authorization")):
            raise PermissionDenied(ADMIN_MESSAGE)
        flushed, total = await self.frontend.control.flush_all()
        if flushed == total:
            return web.Response(text=f"Cache flushed on {total} workers.\n")
        text = f"{total - flushed} of {total} workers did not flush (busy or unreachable).\n"
        return web.Response(text=text, status=400)

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's `/reset_prefix_cache` (bench_serving's --flush-cache posts it): every
        worker's cache flushed, an admin's, as /flush_cache; an empty 200 as vLLM's, and
        /flush_cache's 400 naming the workers that did not flush."""
        resp = await self.flush_cache(request)
        return web.Response(status=200) if resp.status == 200 else resp

    async def abort_request(self, request: web.Request) -> web.Response:
        """SGLang's abort: `{"rid": id}` or `{"abort_all": true}`. A caller reaches only its
        own requests unless auth.Roles lets it reach all (the router's Abort RPC's rule).
        Replies `{"aborted": n}`, the requests the workers found and ended (0: none of the
        caller's has that id now); SGLang answers an empty 200."""
        body = await read_json(request, self.frontend.config.limits)
        rid, abort_all = parse_abort(body)
        authorization = request.headers.get("Authorization")
        me, anyone = caller_of(authorization), self.frontend.config.roles.reaches_all(authorization)
        dispatch = self.frontend.dispatch
        if abort_all:
            aborted = await dispatch.abort_all(me, anyone)
        else:
            aborted = int(await dispatch.abort(rid, me, anyone))
        return web.json_response({"aborted": aborted})

    async def concate_and_append(self, request: web.Request) -> web.Response:
        """SGLang's client calls this when a join concatenates branches (its parallel
        encoding). The client has appended the branches' text itself and sends it with
        its next request, whose cached prefix the radix cache reuses: nothing to do here."""
        return web.json_response({"success": True})

    async def health_generate(self, request: web.Request) -> web.Response:
        """200 once one token comes back through the router, else 503."""
        info = self.frontend.ready()[1]
        token = info.bos_token_id if info.HasField("bos_token_id") else 0
        params = common_pb2.SamplingParams(max_new_tokens=1, temperature=0.0)
        chunks = self.frontend.dispatch.route_and_stream(
            [token], params, f"health-{uuid.uuid4().hex}", stream=False
        )
        try:
            async with aclosing(chunks), asyncio.timeout(HEALTH_TIMEOUT):
                async for _ in chunks:
                    return web.Response(status=200)
        except (TimeoutError, RadixMeshError, grpc.aio.AioRpcError):
            pass
        return web.Response(status=503, headers=retry_after_header(UNAVAILABLE_RETRY_AFTER))

    # ---- generation -----------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._generate(request)
        except (RadixMeshError, ValueError, grpc.aio.AioRpcError) as e:
            raise api_error(e) from None

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        tok, info = self.frontend.ready()
        limits = self.frontend.config.limits
        body = await read_json(request, limits, info.context_length)
        req = await asyncio.to_thread(parse_generate, body, tok, info.context_length)
        limits.check_choices("sampling_params.n", 1, len(req.outputs))  # prompts x n
        for output in req.outputs:
            limits.check_top_logprobs("top_logprobs_num", output.params.top_logprobs_num)
        rid = uuid.uuid4().hex
        rids = req.rids or [
            rid if len(req.outputs) == 1 else f"{rid}-{i}" for i in range(len(req.outputs))
        ]
        states = [OutputState(req, i, rids[i], tok) for i in range(len(req.outputs))]
        jobs = [(i, req.prompts[o.prompt], o.params) for i, o in enumerate(req.outputs)]
        started = time.perf_counter()
        caller = caller_of(request.headers.get("Authorization"))
        last_event_id = request.headers.get("Last-Event-ID") if req.stream else None
        ref = StreamRef() if req.stream and len(jobs) == 1 else None
        chunks: JobChunks
        if ref is not None:
            chunks = self._resumable(req, jobs[0], rids[0], ref, caller, last_event_id)
        elif last_event_id is not None:
            raise InvalidArgument("Last-Event-ID", "only a stream of one output resumes")
        else:
            chunks = self.frontend.stream_jobs(
                jobs, rid, stream=req.stream, rids=rids, hint=req.program, caller=caller
            )
        async with aclosing(chunks):
            if req.stream:
                return await self._stream(request, req, states, chunks, started, ref)
            shown = self.frontend.operator(request)  # which worker served: an admin's
            async for index, worker_id, chunk in chunks:
                states[index].add(chunk, worker_id if shown else "")
        out = [s.to_json(time.perf_counter() - started) for s in states]
        return web.json_response(out if req.batch else out[0])

    async def _resumable(
        self,
        req: GenerateRequest,
        job: tuple[int, list[int], common_pb2.SamplingParams],
        rid: str,
        ref: StreamRef,
        caller: str,
        last_event_id: str | None,
    ) -> JobChunks:
        """A one-output stream's chunks, started resumable or resumed from its start."""
        dispatch = self.frontend.dispatch
        if last_event_id is None:
            _, ids, params = job
            chunks = dispatch.route_and_stream(
                ids, params, rid, stream=True, hint=req.program, caller=caller, resumable=ref
            )
        else:
            ref.stream_id, _ = parse_event_id(last_event_id)
            chunks = dispatch.resume(ref.stream_id, 0, caller, field="Last-Event-ID")
        async with aclosing(chunks):
            async for worker_id, chunk in chunks:
                yield 0, worker_id, chunk

    async def _stream(
        self,
        request: web.Request,
        req: GenerateRequest,
        states: list[OutputState],
        chunks: JobChunks,
        started: float,
        ref: StreamRef | None,
    ) -> web.StreamResponse:
        # Wait for the first chunk before the 200: errors until then get their own status.
        item = await anext(chunks, None)
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                ROUTER_HEADER: ROUTER_ID,
            }
        )
        await resp.prepare(request)

        async def send(payload: Any, event_id: str | None = None) -> None:
            tail = b"" if event_id is None else b"id: " + event_id.encode() + b"\n"
            await resp.write(b"data: " + json.dumps(payload).encode() + b"\n" + tail + b"\n")

        shown = self.frontend.operator(request)  # which worker served: an admin's
        try:
            while item is not None:
                index, worker_id, chunk = item
                states[index].add(chunk, worker_id if shown else "")
                payload = states[index].to_json(time.perf_counter() - started)
                await send(payload, event_id(ref, chunk))
                item = await anext(chunks, None)
        except (RadixMeshError, grpc.aio.AioRpcError) as e:
            await send(api_error(e).to_json())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


# What SGLang's AbortReq carries besides the request: its reason, which the router does not
# pass on (an abort ends with the worker's own reason).
_ABORT_IGNORED = frozenset({"finished_reason", "abort_message"})


def parse_abort(body: Any) -> tuple[str, bool]:
    """(rid, abort_all) of an `/abort_request` body: exactly one of them."""
    if not isinstance(body, dict):
        raise InvalidArgument("body", "the request body must be a JSON object")
    for name in body:
        if name not in ("rid", "abort_all") and name not in _ABORT_IGNORED:
            raise InvalidArgument(str(name)[:64], "unknown field (give rid or abort_all)")
    rid, abort_all = body.get("rid", ""), body.get("abort_all", False)
    if not isinstance(abort_all, bool):
        raise InvalidArgument("abort_all", f"expected true or false, got {abort_all!r:.64}")
    if not isinstance(rid, str) or len(rid) > MAX_REQUEST_ID:
        raise InvalidArgument("rid", f"expected a string of at most {MAX_REQUEST_ID} characters")
    if bool(rid) == abort_all:
        raise InvalidArgument("rid", "give a request id or abort_all: true (one of them)")
    return rid, abort_all


def api_error(e: BaseException) -> ApiError:
    """The HTTP error for `e`, naming the field as SGLang's API does."""
    if isinstance(e, grpc.aio.AioRpcError):
        e = error_from_rpc(e)
    if isinstance(e, InvalidArgument):
        return ApiError(400, e.message, sglang_field(e.field), "invalid_argument")
    return ApiError.from_exception(e)
