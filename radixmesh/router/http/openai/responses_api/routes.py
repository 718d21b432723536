"""OpenAI's Responses API on the router's HTTP app: create, retrieve, delete, input items
and the input-token count.

`POST /v1/responses`: a request is validated and tokenized off the event loop
(convert.py), its `previous_response_id` looked up in the store (store.py: 404 naming the
field when unknown, expired, never stored or another caller's), generated through the
front end's `stream_jobs` (the router's one routing / retry / proxy path), and replied to
as a whole `response` or as the semantic SSE events (output.py). Unless `store: false`,
the finished response is stored with the items it was generated from (items.py); a stream
the client left before its end, or one that failed, is not stored. Errors are OpenAI's
(api_error.py); after a stream opened, one `event: error` carries the error and ends it.
A stream of plain text (no tools to parse, no logprobs) resumes: its events have SSE ids,
and the same request sent again with the last one as `Last-Event-ID` (to any router
replica) gets the events after it, numbered on from the client's last `sequence_number`,
under the same response id; the replica that finishes it stores it (event_ids.py).

`GET` / `DELETE /v1/responses/{response_id}` and `GET .../input_items` read the store: a
response that is not there (never stored, `store: false`, expired, dropped, deleted,
another caller's, or its worker gone) is a 404 naming `response_id`. The entries live on
the workers (worker_store.py), so every router replica finds them. `POST
/v1/responses/input_tokens` counts the prompt a create with the same fields would have.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import grpc
from aiohttp import web

from radixmesh.auth import caller_of
from radixmesh.errors import InvalidArgument, RadixMeshError
from radixmesh.router.http.api_error import STATUS_KEY, STATUS_NAMES, ApiError, read_json
from radixmesh.router.http.event_ids import IdentifiedEvents, resumption
from radixmesh.router.http.event_stream import EventStream, first_chunk
from radixmesh.router.http.openai import generation
from radixmesh.router.http.openai.convert import Generation
from radixmesh.router.http.openai.generation import WORKER_HEADER
from radixmesh.router.http.openai.responses_api import requests as rq
from radixmesh.router.http.openai.responses_api.convert import (
    count_input_tokens,
    field_name,
    generation_of,
    parse_count_request,
    parse_request,
)
from radixmesh.router.http.openai.responses_api.items import listed, page, page_params
from radixmesh.router.http.openai.responses_api.output import ResponseReply, echoed, response_id
from radixmesh.router.http.openai.responses_api.store import (
    Json,
    MemoryResponseStore,
    ResponseStore,
    StoredResponse,
)
from radixmesh.router.http.openai.responses_api.worker_store import WorkerResponseStore
from radixmesh.tokenizer import TokenizerLike

if TYPE_CHECKING:
    from radixmesh.router.http.frontend import Frontend

PATH = "/v1/responses"


class ResponsesRoutes:
    def __init__(self, frontend: Frontend, store: ResponseStore | None = None) -> None:
        self.frontend = frontend
        config = frontend.config
        self.limits = config.limits
        if store is None:
            store = _default_store(frontend)
        self.store = store
        self._puts: set[asyncio.Future[bool]] = set()  # stores under way (`_store`)

    def register(self, app: web.Application) -> None:
        app.router.add_post(PATH, self.create)
        app.router.add_post(PATH + "/input_tokens", self.input_tokens)
        app.router.add_get(PATH + "/{response_id}", self.retrieve)
        app.router.add_delete(PATH + "/{response_id}", self.delete)
        app.router.add_get(PATH + "/{response_id}/input_items", self.input_items)

    async def create(self, request: web.Request) -> web.StreamResponse:
        tok, info = self.frontend.ready()
        body = await read_json(request, self.limits, info.context_length)
        config = self.frontend.config
        req = await asyncio.to_thread(parse_request, body, strict=config.strict_openai)
        self.frontend.check_model(req.model)
        self.limits.check_top_logprobs("top_logprobs", req.top_logprobs)
        caller = caller_of(request.headers.get("Authorization"))
        history = await self._history(caller, req.previous_response_id)
        gen = await asyncio.to_thread(self._generation, req, history, tok, info.context_length)
        # The workers know the request by this id; the response gets its own from the
        # store once the serving worker is known (an id may name where it is stored).
        rid = response_id()
        workers: set[str] = set()
        reply = ResponseReply(gen, rid, echoed(req), tok)
        ref, after = resumption(gen, request.headers.get("Last-Event-ID"))
        stream_jobs = functools.partial(self.frontend.stream_jobs, caller=caller)
        chunks = generation.reply_chunks(
            stream_jobs, self.frontend.dispatch, gen, rid, workers, ref, after, caller
        )
        async with aclosing(chunks):
            first = await first_chunk(chunks, lambda f: field_name(gen.openai_field(f)))
            if ref is None:
                reply.rid = self.store.new_id(min(workers, default=""))
            else:  # the id every replica gives this stream's response
                reply.rid = self.store.stream_response_id(ref.stream_id)
            if gen.stream:
                events = IdentifiedEvents(reply, ref, after)
                reply.created = events.created
                resp = await _stream(request, reply, events, first, chunks, workers)
            else:
                reply.of(first)
                async for _, chunk in chunks:
                    reply.of(chunk)
                resp = web.json_response(
                    reply.response(), headers={WORKER_HEADER: ",".join(sorted(workers))}
                )
        if req.store is not False and reply.status in ("completed", "incomplete"):
            inputs = listed(req.input, (item["id"] for item in history))
            entry = StoredResponse(reply.response(), (*history, *inputs))
            await self._store(caller, entry)
        return resp

    async def _store(self, caller: str, entry: StoredResponse) -> None:
        """Keep `entry`, even when the handler is cancelled meanwhile (a client that leaves
        once it has a stream's last event, before the stream's end: the app cancels the
        handler of a disconnected client)."""
        task = asyncio.ensure_future(self.store.put(caller, entry))
        self._puts.add(task)
        task.add_done_callback(self._puts.discard)
        await asyncio.shield(task)

    async def input_tokens(self, request: web.Request) -> web.Response:
        tok, info = self.frontend.ready()
        body = await read_json(request, self.limits, info.context_length)
        config = self.frontend.config
        req = await asyncio.to_thread(parse_count_request, body, strict=config.strict_openai)
        if req.model is not None:
            self.frontend.check_model(req.model)
        caller = caller_of(request.headers.get("Authorization"))
        history = await self._history(caller, req.previous_response_id)
        count = await asyncio.to_thread(
            lambda: count_input_tokens(
                req,
                rq.items_of(history),
                tokenizer=tok,
                context_length=info.context_length,
                tool_call_parser=config.tool_call_parser,
            )
        )
        return web.json_response({"object": "response.input_tokens", "input_tokens": count})

    async def retrieve(self, request: web.Request) -> web.Response:
        # Streaming a stored response replays a background one's events: none here.
        if request.query.get("stream", "false").lower() not in ("false", "0"):
            raise InvalidArgument("stream", "streaming a stored response is not supported")
        return web.json_response((await self._stored(request)).response)

    async def delete(self, request: web.Request) -> web.Response:
        rid = request.match_info["response_id"]
        if not await self.store.delete(caller_of(request.headers.get("Authorization")), rid):
            raise _not_stored(rid)
        return web.json_response({"id": rid, "object": "response", "deleted": True})

    async def input_items(self, request: web.Request) -> web.Response:
        after, limit, ascending = page_params(request.query)
        stored = await self._stored(request)
        return web.json_response(page(stored.input_items, after, limit, ascending))

    # ---- the store ----------------------------------------------------------------------

    async def _history(self, caller: str, previous: str | None) -> tuple[Json, ...]:
        """The conversation `previous_response_id` continues (none without it)."""
        if previous is None:
            return ()
        found = await self.store.get(caller, previous)
        if found is None:
            message = (
                f"no stored response {previous!r} (unknown, expired, deleted, stored with "
                "store: false, another caller's, or its worker is gone)"
            )
            raise ApiError(404, message, "previous_response_id", "previous_response_not_found")
        return found.conversation()

    async def _stored(self, request: web.Request) -> StoredResponse:
        rid = request.match_info["response_id"]
        stored = await self.store.get(caller_of(request.headers.get("Authorization")), rid)
        if stored is None:
            raise _not_stored(rid)
        return stored

    def _generation(
        self,
        req: rq.ResponsesRequest,
        history: Sequence[Json],
        tok: TokenizerLike,
        context_length: int,
    ) -> Generation:
        return generation_of(
            req,
            rq.items_of(history),
            tokenizer=tok,
            context_length=context_length,
            tool_call_parser=self.frontend.config.tool_call_parser,
        )


def _default_store(frontend: Frontend) -> ResponseStore:
    """On the workers (worker_store.py); none kept when a bound is 0."""
    config = frontend.config
    if config.response_store_entries == 0 or config.response_store_bytes == 0:
        return MemoryResponseStore(0, 0, config.response_store_ttl)
    return WorkerResponseStore(
        frontend.control.pool, config.response_store_ttl, config.response_store_bytes
    )


def _not_stored(rid: str) -> ApiError:
    message = (
        f"no stored response {rid!r} (unknown, expired, deleted, stored with store: false, "
        "another caller's, or its worker is gone)"
    )
    return ApiError(404, message, "response_id", "response_not_found")


async def _stream(
    request: web.Request,
    reply: ResponseReply,
    events: IdentifiedEvents,
    first: Any,
    chunks: generation.Chunks,
    workers: set[str],
) -> web.StreamResponse:
    sse = await EventStream.open(request, workers)
    try:
        await sse.relay(events, first, chunks)
    except (RadixMeshError, grpc.aio.AioRpcError) as e:
        error = ApiError.from_exception(e)
        request[STATUS_KEY] = STATUS_NAMES.get(error.status, "UNKNOWN")
        reply.status = "failed"
        fields = error.to_json()["error"]
        await sse.send("error", {"type": "error", "sequence_number": reply.sequence, **fields})
    await sse.close()
    return sse.resp
