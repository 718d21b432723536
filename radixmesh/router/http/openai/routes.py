"""The OpenAI-compatible endpoints, registered on the router's HTTP app (http.py).

`POST /v1/completions`, `POST /v1/chat/completions`: parsed by convert.py, served by
generation.py through the router's one routing / retry / proxy path. Validation and
tokenization run in a thread, so a long prompt does not stall the event loop (bodies are
at most 64 MiB, the app's limit). `POST /tokenize` and `POST /detokenize` answer from the
router's own tokenizer (the model's); `GET /openapi.json`: the description (openapi.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Callable
from contextlib import aclosing
from typing import TYPE_CHECKING

import grpc
from aiohttp import web

from radixmesh.auth import caller_of
from radixmesh.errors import InvalidArgument, RadixMeshError
from radixmesh.router.dispatch import StreamRef
from radixmesh.router.http.api_error import ApiError, read_json
from radixmesh.router.http.event_ids import EventId, derived_id
from radixmesh.router.http.openai import generation
from radixmesh.router.http.openai import requests as rq
from radixmesh.router.http.openai import responses as rs
from radixmesh.router.http.openai.convert import (
    ChatOptions,
    Generation,
    parse_chat,
    parse_completion,
    parse_tokenize,
    token_ids,
    tokenize,
    validate,
)
from radixmesh.router.http.openai.embeddings import embed_all, parse_embeddings
from radixmesh.router.http.openai.generation import WORKER_HEADER
from radixmesh.router.http.openai.openapi import openapi_document
from radixmesh.version import __version__

if TYPE_CHECKING:
    from radixmesh.router.http.frontend import Frontend


class OpenAIRoutes:
    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend
        self.limits = frontend.config.limits

    def register(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/openapi.json", self.openapi)

    @property
    def strict(self) -> bool:
        return self.frontend.config.strict_openai

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document(__version__))

    async def embeddings(self, request: web.Request) -> web.Response:
        tok, info = self.frontend.ready()
        body = await read_json(request, self.limits, info.context_length)
        job = await asyncio.to_thread(
            parse_embeddings,
            body,
            tokenizer=tok,
            context_length=info.context_length,
            hidden_size=info.hidden_size,
            strict=self.strict,
        )
        self.frontend.check_model(job.model)
        route = self.frontend.dispatch.route_and_embed
        reply = await embed_all(job, route, "embd-" + uuid.uuid4().hex)
        return web.json_response(reply.dump())

    async def tokenize(self, request: web.Request) -> web.Response:
        tok, info = self.frontend.ready()
        body = await read_json(request, self.limits, info.context_length)

        def run() -> rs.TokenizeResponse:
            req = parse_tokenize(body, tokenizer=tok, strict=self.strict)
            if req.model is not None:
                self.frontend.check_model(req.model)
            ids = tokenize(req, tok)
            strs = tok.convert_ids_to_tokens(ids) if req.return_token_strs else None
            return rs.TokenizeResponse(
                tokens=ids, count=len(ids), max_model_len=info.context_length, token_strs=strs
            )

        return await _json_off_the_loop(run)

    async def detokenize(self, request: web.Request) -> web.Response:
        tok, _ = self.frontend.ready()
        body = await read_json(request, self.limits)

        def run() -> rs.DetokenizeResponse:
            req = validate(rq.DetokenizeRequest, body, strict=self.strict)
            if req.model is not None:
                self.frontend.check_model(req.model)
            ids = token_ids(req.tokens, tok, "tokens") if req.tokens else []
            text = tok.decode(ids, skip_special_tokens=bool(req.skip_special_tokens))
            return rs.DetokenizeResponse(prompt=text)

        return await _json_off_the_loop(run)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        tok, info = self.frontend.ready()
        body = await read_json(request, self.limits, info.context_length)
        gen: Generation
        if chat:
            c = self.frontend.config
            options = ChatOptions(c.tool_call_parser, c.separate_reasoning)
            gen = await asyncio.to_thread(
                parse_chat,
                body,
                tokenizer=tok,
                context_length=info.context_length,
                strict=self.strict,
                options=options,
            )
        else:
            gen = await asyncio.to_thread(
                parse_completion,
                body,
                tokenizer=tok,
                context_length=info.context_length,
                strict=self.strict,
            )
        self.frontend.check_model(gen.model)
        field = "n" if chat or len(gen.prompts) == 1 else "prompt"
        self.limits.check_choices(field, len(gen.prompts), gen.n)
        self.limits.check_top_logprobs("top_logprobs" if chat else "logprobs", gen.top_logprobs)
        prefix = "chatcmpl-" if chat else "cmpl-"
        rid = prefix + uuid.uuid4().hex
        workers: set[str] = set()
        caller = caller_of(request.headers.get("Authorization"))
        stream_jobs = functools.partial(self.frontend.stream_jobs, caller=caller)
        last_event_id = request.headers.get("Last-Event-ID") if gen.stream else None
        replay = generation.replayed(gen)
        after: EventId | None = None
        if generation.resumable(gen) or replay:
            ref, resume, after = _resume_point(last_event_id, replay)
            # The same id on every replica that serves the stream.
            rid = prefix + derived_id(ref.worker_rid, "completion")
            source = generation.resumable_choice(
                self.frontend.dispatch, gen, rid, workers, ref, caller, resume
            )
        elif last_event_id is not None:
            raise InvalidArgument(
                "Last-Event-ID",
                "only a stream of one choice resumes, and not a completion's with logprobs, "
                "nor a chat's with both logprobs and tools or reasoning to parse",
            )
        else:
            ref = None
            source = generation.choices(stream_jobs, gen, rid, workers)
        chunks = _named_errors(source, gen)
        async with aclosing(chunks):
            if gen.stream:
                return await generation.stream(
                    request,
                    gen,
                    rid,
                    chunks,
                    tok,
                    lambda e: _api_error(e, gen),
                    workers,
                    ref,
                    resumed=last_event_id is not None and not replay,
                    replay=replay,
                    after=after,
                )
            body = await generation.collect(gen, rid, chunks, tok)
        return web.json_response(body, headers={WORKER_HEADER: ",".join(sorted(workers))})


def _resume_point(
    last_event_id: str | None, replay: bool
) -> tuple[StreamRef, tuple[str, int] | None, EventId | None]:
    """A resumable stream's ref, where its worker continues (stream id, token offset; None
    for a new stream) and, resuming by a replay (generation.replayed), the event after
    which the client lacks the events."""
    if last_event_id is None:
        return StreamRef(), None, None
    if replay:
        after = EventId.parse(last_event_id)
        return StreamRef.resumed(after.stream_id, "Last-Event-ID"), (after.stream_id, 0), after
    stream_id, offset = generation.parse_event_id(last_event_id)
    return StreamRef.resumed(stream_id, "Last-Event-ID"), (stream_id, offset), None


def _api_error(e: BaseException, gen: Generation) -> ApiError:
    return ApiError.from_exception(e, gen.openai_field)


async def _named_errors(chunks: generation.Chunks, gen: Generation) -> generation.Chunks:
    """The chunks; a worker's error before the first one becomes an ApiError naming the
    client's field (a constraint's compile error names `response_format`, not `json_schema`)."""
    first = True
    async with aclosing(chunks):
        try:
            async for item in chunks:
                first = False
                yield item
        except (RadixMeshError, ValueError, grpc.aio.AioRpcError) as e:
            if first:
                raise _api_error(e, gen) from e
            raise


async def _json_off_the_loop(
    run: Callable[[], rs.TokenizeResponse | rs.DetokenizeResponse],
) -> web.Response:
    """`run`'s reply, built and serialized (as `web.json_response` would) on a thread: a
    4M-token /tokenize reply's JSON alone held the event loop ~0.27 s."""
    body = await asyncio.to_thread(lambda: json.dumps(run().dump()).encode())
    return web.Response(body=body, content_type="application/json")
