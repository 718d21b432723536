"""`POST /v1/responses`, registered on the router's HTTP app.

A request is validated and tokenized off the event loop (convert.py), its
`previous_response_id` looked up in the router's store (store.py: 404 naming the field
when unknown, expired, never stored or another caller's), generated through the front
end's `stream_jobs` (the router's one routing / retry / proxy path), and replied to as a
whole `response` or as the semantic SSE events (output.py). Unless `store: false`, the
finished response's conversation is stored for a later `previous_response_id`; a stream
the client left before its end is not stored. Errors are OpenAI's (api_error.py); after a
stream opened, one `event: error` carries the error and ends it.
"""

from __future__ import annotations

import asyncio
import functools
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import grpc
from aiohttp import web

from radixmesh.auth import caller_of
from radixmesh.errors import RadixMeshError
from radixmesh.router.http.api_error import STATUS_KEY, STATUS_NAMES, ApiError, read_json
from radixmesh.router.http.event_stream import EventStream, first_chunk
from radixmesh.router.http.openai import generation
from radixmesh.router.http.openai.generation import WORKER_HEADER
from radixmesh.router.http.openai.responses_api import requests as rq
from radixmesh.router.http.openai.responses_api.convert import (
    field_name,
    generation_of,
    parse_request,
)
from radixmesh.router.http.openai.responses_api.output import ResponseReply, echoed, response_id
from radixmesh.router.http.openai.responses_api.store import ResponseStore

if TYPE_CHECKING:
    from radixmesh.router.http.frontend import Frontend


class ResponsesRoutes:
    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend
        config = frontend.config
        self.limits = config.limits
        self.store = ResponseStore(config.response_store_bytes, config.response_store_ttl)

    def register(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self.create)

    async def create(self, request: web.Request) -> web.StreamResponse:
        tok, info = self.frontend.ready()
        body = await read_json(request, self.limits, info.context_length)
        config = self.frontend.config
        req = await asyncio.to_thread(parse_request, body, strict=config.strict_openai)
        self.frontend.check_model(req.model)
        caller = caller_of(request.headers.get("Authorization"))
        history: tuple[rq.Item, ...] = ()
        if req.previous_response_id is not None:
            found = self.store.get(caller, req.previous_response_id)
            if found is None:
                message = (
                    f"no stored response {req.previous_response_id!r} (unknown, expired, stored "
                    "with store: false, or on another router replica)"
                )
                raise ApiError(404, message, "previous_response_id", "previous_response_not_found")
            history = found
        gen = await asyncio.to_thread(
            generation_of,
            req,
            history,
            tokenizer=tok,
            context_length=info.context_length,
            tool_call_parser=config.tool_call_parser,
        )
        rid = response_id()
        workers: set[str] = set()
        reply = ResponseReply(gen, rid, echoed(req))
        stream_jobs = functools.partial(self.frontend.stream_jobs, caller=caller)
        chunks = generation.choices(stream_jobs, gen, rid, workers)
        async with aclosing(chunks):
            first = await first_chunk(chunks, lambda f: field_name(gen.openai_field(f)))
            if gen.stream:
                resp = await _stream(request, reply, first, chunks, workers)
            else:
                reply.of(first)
                async for _, chunk in chunks:
                    reply.of(chunk)
                resp = web.json_response(
                    reply.response(), headers={WORKER_HEADER: ",".join(sorted(workers))}
                )
        if req.store is not False and reply.status in ("completed", "incomplete"):
            self.store.put(caller, rid, (*history, *req.input, *reply.items()))
        return resp


async def _stream(
    request: web.Request,
    reply: ResponseReply,
    first: Any,
    chunks: generation.Chunks,
    workers: set[str],
) -> web.StreamResponse:
    sse = await EventStream.open(request, workers)
    try:
        await sse.send_all(reply.opening())
        await sse.send_all(reply.of(first))
        async for _, chunk in chunks:
            await sse.send_all(reply.of(chunk))
    except (RadixMeshError, grpc.aio.AioRpcError) as e:
        error = ApiError.from_exception(e)
        request[STATUS_KEY] = STATUS_NAMES.get(error.status, "UNKNOWN")
        reply.status = "failed"
        fields = error.to_json()["error"]
        await sse.send("error", {"type": "error", "sequence_number": reply.sequence, **fields})
    await sse.close()
    return sse.resp
