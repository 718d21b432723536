"""`POST /v1/messages` and `POST /v1/messages/count_tokens`, registered on the HTTP app.

A request is parsed off the event loop (convert.py), generated through the front end's
`stream_jobs` (the router's one routing / retry / proxy path, the chat completions one),
and replied to as a whole `message` or as named SSE events (replies.py).

Errors are Anthropic's: `{"type": "error", "error": {"type", "message"}}` with the HTTP
status of the error catalogue (`anthropic_error`: http.py renders every error of these
paths with it, the middleware's 401 and 429 included). Anthropic's errors have no field
member, so the message starts with the field, in Anthropic's spelling
(`stop_sequences: ...`). An error after a stream opened is one `event: error`, which
Anthropic's client raises. The key may come as `x-api-key` (Anthropic's header) or as
`Authorization: Bearer`.

A stream of plain text (no tools, no thinking to separate) resumes: its events have SSE
ids, and the same request sent again with the last one as `Last-Event-ID` (to any router
replica) gets the events after it, and only those (no second `message_start`), under the
same message id (event_ids.py).
"""

from __future__ import annotations

import asyncio
import functools
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import grpc
from aiohttp import web

from radixmesh.auth import caller_of, with_api_key
from radixmesh.errors import RadixMeshError
from radixmesh.router.http.anthropic.convert import count_tokens, field_name, parse_messages
from radixmesh.router.http.anthropic.replies import MessageReply, message_id
from radixmesh.router.http.api_error import STATUS_KEY, STATUS_NAMES, ApiError, read_json
from radixmesh.router.http.event_ids import IdentifiedEvents, derived_id, resumption
from radixmesh.router.http.event_stream import EventStream, first_chunk
from radixmesh.router.http.openai import generation
from radixmesh.router.http.openai.generation import WORKER_HEADER

if TYPE_CHECKING:
    from radixmesh.router.http.frontend import Frontend

PATH = "/v1/messages"

# HTTP status -> Anthropic's error type (anthropic.com's errors page); 503 is "overloaded"
# (Anthropic's 529), which its client retries.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def is_anthropic(path: str) -> bool:
    """Whether a request path is the Messages API's (its errors are Anthropic's)."""
    return path == PATH or path.startswith(PATH + "/")


def authorization(request: web.Request) -> str | None:
    """The request's key as an `authorization` value: the header, else `x-api-key`."""
    return with_api_key(request.headers.get("Authorization"), request.headers.get("x-api-key"))


def error_json(e: ApiError) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(e.status, "api_error" if e.status >= 500 else "invalid_request_error")
    message = f"{e.param}: {e.message}" if e.param else e.message
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error(e: ApiError) -> web.Response:
    """An error reply in Anthropic's layout (ApiError.response's status and Retry-After)."""
    resp = e.response()
    return web.json_response(error_json(e), status=e.status, headers=_retry_after(resp))


def _retry_after(resp: web.Response) -> dict[str, str]:
    value = resp.headers.get("Retry-After")
    return {"Retry-After": value} if value is not None else {}


class AnthropicRoutes:
    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend
        self.limits = frontend.config.limits

    def register(self, app: web.Application) -> None:
        app.router.add_post(PATH, self.messages)
        app.router.add_post(PATH + "/count_tokens", self.count_tokens)

    async def count_tokens(self, request: web.Request) -> web.Response:
        tok, info = self.frontend.ready()
        body = await read_json(request, self.limits, info.context_length)
        strict = self.frontend.config.strict_openai
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            self.frontend.check_model(body["model"])
        tokens = await asyncio.to_thread(
            count_tokens, body, tokenizer=tok, context_length=info.context_length, strict=strict
        )
        return web.json_response({"input_tokens": tokens})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        tok, info = self.frontend.ready()
        body = await read_json(request, self.limits, info.context_length)
        config = self.frontend.config
        gen = await asyncio.to_thread(
            parse_messages,
            body,
            tokenizer=tok,
            context_length=info.context_length,
            strict=config.strict_openai,
            tool_call_parser=config.tool_call_parser,
        )
        self.frontend.check_model(gen.model)
        workers: set[str] = set()
        caller = caller_of(authorization(request))
        ref, after = resumption(gen, request.headers.get("Last-Event-ID"))
        # A resumable stream's message id is the same on every replica that serves it.
        rid = message_id() if ref is None else "msg_" + derived_id(ref.worker_rid, "message")
        reply = MessageReply(gen, rid)
        stream_jobs = functools.partial(self.frontend.stream_jobs, caller=caller)
        chunks = generation.reply_chunks(
            stream_jobs, self.frontend.dispatch, gen, rid, workers, ref, after, caller
        )
        async with aclosing(chunks):
            first = await first_chunk(chunks, lambda f: field_name(gen.openai_field(f)))
            if gen.stream:
                events = IdentifiedEvents(reply, ref, after)
                return await _stream(request, events, first, chunks, workers)
            reply.opening(first)
            reply.of(first)
            async for _, chunk in chunks:
                reply.of(chunk)
        return web.json_response(
            reply.message(), headers={WORKER_HEADER: ",".join(sorted(workers))}
        )


async def _stream(
    request: web.Request,
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
        await sse.send("error", error_json(error))
    await sse.close()
    return sse.resp
