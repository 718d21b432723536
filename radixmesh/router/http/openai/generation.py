"""Serving a parsed completions / chat request: fan out its choices, reply whole or as SSE.

Every choice (prompt x n) is one worker request through the HTTP front end's `stream_jobs`
(over the router's `route_and_stream`); their chunks interleave as they come. The whole
reply is built from response models (responses.py); a stream sends one chunk per worker
chunk, then the usage chunk (with `stream_options.include_usage`) and `[DONE]`. Errors
before the first chunk get their own HTTP status; after it, one `data: {"error": ...}`
event ends the stream.

A stream of one choice without tools or reasoning to parse (plain text; a chat's also with
logprobs) is resumable (router/dispatch.py): each event that carries a chunk has an SSE
id, "<stream id>/<completion tokens so far>", and the same request sent again with that
id as `Last-Event-ID` (to any router of the cluster) continues after it: no token lost,
none twice. A chat stream of one choice with tools or reasoning to parse (no logprobs)
resumes by a replay through a fresh parser, as Anthropic's and the Responses API's
streams do (router/http/event_ids.py; `replayed`). Other streams (n > 1, several
prompts, a completion's logprobs, whose text offsets a token offset does not give, a
chat's logprobs with a parser) have no ids, and a `Last-Event-ID` on one is a 400 naming
the header; a client whose router died sees the stream cut.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

import grpc
from aiohttp import web

from radixmesh.errors import InvalidArgument, RadixMeshError
from radixmesh.router.dispatch import Dispatcher, StreamRef
from radixmesh.router.http.api_error import STATUS_KEY, STATUS_NAMES, ApiError
from radixmesh.router.http.event_ids import EventId, IdentifiedEvents, SseEvent
from radixmesh.router.http.openai import responses as rs
from radixmesh.router.http.openai.convert import Generation
from radixmesh.router.http.openai.message import Message, MessageStream
from radixmesh.router.http.openai.reply import (
    UsageCounter,
    chat_logprobs,
    choice_usage,
    completion_logprobs,
    finish_reason,
    join_completion_logprobs,
    prompt_logprobs,
)
from radixmesh.router.service import ROUTER_ID
from radixmesh.tokenizer import TokenizerLike
from radixmesh.v1 import common_pb2

Chunks = AsyncGenerator[tuple[int, common_pb2.GenerateChunk], None]
# The HTTP front end's `stream_jobs`: (index, token ids, params) jobs -> (index, worker, chunk).
StreamJobs = Callable[..., AsyncGenerator[tuple[int, str, common_pb2.GenerateChunk], None]]
# Names the workers that served a reply (benchmarks and debugging read it).
WORKER_HEADER = "X-Radixmesh-Worker"
# Names the router replica that serves a stream (host:pid): a test or an operator can
# tell which replica's death cut it.
ROUTER_HEADER = "X-Radixmesh-Router"


def resumable(gen: Generation) -> bool:
    """Whether `gen`'s stream can resume: one choice without a parser (tools, reasoning),
    whose events each carry their chunk's text alone: plain text, or a chat's with its
    tokens' logprobs (a completion's logprobs carry text offsets, which a resume at a
    token offset does not know)."""
    return (
        gen.stream
        and gen.num_choices == 1
        and (gen.top_logprobs is None or gen.chat)
        and MessageStream.of(gen) is None
    )


def replayed(gen: Generation) -> bool:
    """Whether `gen`'s stream resumes by a replay (router/http/event_ids.py): one chat
    choice whose text a parser splits (tools, reasoning), without logprobs (a replay cuts
    a chunk at a character, where its tokens cannot be told apart)."""
    return (
        gen.stream
        and gen.chat
        and gen.num_choices == 1
        and gen.top_logprobs is None
        and MessageStream.of(gen) is not None
    )


def event_id(ref: StreamRef | None, chunk: common_pb2.GenerateChunk) -> str | None:
    """A chunk's SSE id on a resumable stream: where a resume continues after it."""
    return None if ref is None else f"{ref.stream_id}/{chunk.completion_tokens}"


def parse_event_id(value: str) -> tuple[str, int]:
    """(stream id, offset) of a `Last-Event-ID`; InvalidArgument naming the header."""
    stream_id, _, offset = value.rpartition("/")
    if not stream_id or not offset.isdigit() or len(offset) > 12:
        raise InvalidArgument("Last-Event-ID", f"not an event id of this API: {value[:160]!r}")
    return stream_id, int(offset)


async def resumable_choice(
    dispatch: Dispatcher,
    gen: Generation,
    rid: str,
    workers: set[str],
    ref: StreamRef,
    caller: str,
    resume: tuple[str, int] | None,
) -> Chunks:
    """The one choice of a resumable stream, as `choices` yields it: started (the worker
    holds it for a resume), or continued from `resume` (stream id, offset in tokens)."""
    if resume is None:
        chunks = dispatch.route_and_stream(
            gen.prompts[0], gen.params[0], rid, stream=True, caller=caller, resumable=ref
        )
    else:
        ref.stream_id, offset = resume
        chunks = dispatch.resume(ref.stream_id, offset, caller, field="Last-Event-ID")
    async with aclosing(chunks):
        async for worker, chunk in chunks:
            workers.add(worker)
            yield 0, chunk


def reply_chunks(
    stream_jobs: StreamJobs,
    dispatch: Dispatcher,
    gen: Generation,
    rid: str,
    workers: set[str],
    ref: StreamRef | None,
    after: EventId | None,
    caller: str,
) -> Chunks:
    """The chunks of a stream whose events resume by a replay (Anthropic's Messages, the
    Responses API; `event_ids.resumption` gives `ref` and `after`): `choices` when it does
    not resume; a resumable one started, or replayed from the worker's first output when
    it resumes after `after` (event_ids.py sends only the events past it)."""
    if ref is None:
        return choices(stream_jobs, gen, rid, workers)
    resume = None if after is None else (after.stream_id, 0)
    return resumable_choice(dispatch, gen, rid, workers, ref, caller, resume)


async def choices(stream_jobs: StreamJobs, gen: Generation, rid: str, workers: set[str]) -> Chunks:
    """Every choice's chunks as (choice index, chunk), the choices generated at once
    (choice index = prompt x n + choice); the workers that serve them go into `workers`."""
    jobs = [
        (i * gen.n + j, ids, gen.params[j])
        for i, ids in enumerate(gen.prompts)
        for j in range(gen.n)
    ]
    chunks = stream_jobs(jobs, rid, stream=gen.stream)
    async with aclosing(chunks):
        async for index, worker, chunk in chunks:
            workers.add(worker)
            yield index, chunk


async def collect(gen: Generation, rid: str, chunks: Chunks, tok: TokenizerLike) -> dict[str, Any]:
    """The whole reply (a `chat.completion` or a `text_completion`)."""
    if gen.chat:
        return await _collect_chat(gen, rid, chunks, tok)
    return await _collect_completion(gen, rid, chunks, tok)


async def _collect_chat(
    gen: Generation, rid: str, chunks: Chunks, tok: TokenizerLike
) -> dict[str, Any]:
    total = gen.num_choices
    streams = [MessageStream.of(gen) for _ in range(total)]
    messages = [Message() for _ in range(total)]
    reasons: list[rs.FinishReason | None] = [None] * total
    lps: list[list[rs.TokenLogprob]] = [[] for _ in range(total)]
    usage = UsageCounter(gen.n)
    async for index, chunk in chunks:
        if gen.top_logprobs is not None:
            lps[index] += chat_logprobs(chunk, tok)
        reasons[index] = finish_reason(chunk) or reasons[index]
        stream = streams[index]
        if stream is None:
            messages[index].content += chunk.text
        else:
            messages[index].add(stream.step(chunk.text, last=reasons[index] is not None))
        usage.add(index, chunk)
    choices = [
        rs.ChatChoice(
            index=i,
            message=m.reply(gen.reasoning_tail is not None),
            logprobs=None if gen.top_logprobs is None else rs.ChatLogprobs(content=lps[i]),
            finish_reason=m.finish_reason(reasons[i]),
        )
        for i, m in enumerate(messages)
    ]
    return rs.ChatCompletion(
        id=rid, created=gen.created, model=gen.model, choices=choices, usage=usage.usage()
    ).dump()


async def _collect_completion(
    gen: Generation, rid: str, chunks: Chunks, tok: TokenizerLike
) -> dict[str, Any]:
    total = gen.num_choices
    heads = [gen.echo[i // gen.n] if gen.echo else "" for i in range(total)]
    texts = list(heads)
    reasons: list[rs.FinishReason | None] = [None] * total
    lps: list[rs.CompletionLogprobs | None] = [None] * total
    usage = UsageCounter(gen.n)
    async for index, chunk in chunks:
        if gen.top_logprobs is not None:
            lp = completion_logprobs(chunk.logprobs, chunk.top_logprobs, tok, len(texts[index]))
            joined = join_completion_logprobs(lps[index], lp)
            if gen.echo and chunk.input_logprobs:  # the last chunk: the prompt's, first
                joined = join_completion_logprobs(prompt_logprobs(chunk, tok), joined)
            lps[index] = joined
        texts[index] += chunk.text
        usage.add(index, chunk)
        reasons[index] = finish_reason(chunk) or reasons[index]
    choices = [
        rs.CompletionChoice(index=i, text=texts[i], logprobs=lps[i], finish_reason=reasons[i])
        for i in range(total)
    ]
    return rs.Completion(
        id=rid, created=gen.created, model=gen.model, choices=choices, usage=usage.usage()
    ).dump()


class _Sse:
    """One SSE response: `data: <json>` events, with an `id:` where given."""

    def __init__(self, resp: web.StreamResponse) -> None:
        self.resp = resp

    async def send(self, payload: dict[str, Any] | str, event_id: str | None = None) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        tail = b"" if event_id is None else b"id: " + event_id.encode() + b"\n"
        await self.resp.write(b"data: " + data.encode() + b"\n" + tail + b"\n")


async def stream(
    request: web.Request,
    gen: Generation,
    rid: str,
    chunks: Chunks,
    tok: TokenizerLike,
    error: Callable[[BaseException], ApiError],
    workers: set[str],
    ref: StreamRef | None = None,
    resumed: bool = False,
    replay: bool = False,
    after: EventId | None = None,
) -> web.StreamResponse:
    """The reply as SSE. `error` turns a failure after the first chunk into its event;
    `workers` has the serving worker once the first chunk came (`choices` fills it).
    `ref`: a resumable stream's (events get ids); `resumed`: it continues one at a token
    offset (no opening events: the client has them); `replay`: it resumes by a replay
    (`replayed`), after the event `after` when it continues one."""
    # Wait for the first chunk before the 200: errors until then get their own status.
    item = await anext(chunks, None)
    identified: IdentifiedEvents | None = None
    if after is not None:  # the chunks' time as the client first saw it
        gen = dataclasses.replace(gen, created=after.created)
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    headers[ROUTER_HEADER] = ROUTER_ID
    if item is not None and gen.num_choices == 1:
        headers[WORKER_HEADER] = ",".join(sorted(workers))
    resp = web.StreamResponse(headers=headers)
    await resp.prepare(request)
    sse = _Sse(resp)
    events = _ChunkEvents(gen, rid, tok)
    if replay:
        identified = IdentifiedEvents(_ReplayedChoice(events), ref, after, gen.created)
    try:
        for payload in [] if resumed or replay else events.opening():
            await sse.send(payload)
        while item is not None:
            if identified is not None:
                for (_, payload), eid in identified.of(item[1]):
                    await sse.send(payload, eid)
            else:
                for payload in events.of(*item):
                    await sse.send(payload, event_id(ref, item[1]))
            item = await anext(chunks, None)
    except (RadixMeshError, grpc.aio.AioRpcError) as e:
        api_error = error(e)
        request[STATUS_KEY] = STATUS_NAMES.get(api_error.status, "UNKNOWN")
        await sse.send(api_error.to_json())
    if gen.include_usage:
        await sse.send(events.usage_event())
    await sse.send("[DONE]")
    await resp.write_eof()
    return resp


class _ReplayedChoice:
    """A one-choice stream's events as event_ids.py replays them (the events have no
    names: chat completions send `data:` only)."""

    def __init__(self, events: _ChunkEvents) -> None:
        self.events = events

    def opening(self, first: common_pb2.GenerateChunk) -> list[SseEvent]:
        return [("", payload) for payload in self.events.opening()]

    def of(self, chunk: common_pb2.GenerateChunk) -> list[SseEvent]:
        return [("", payload) for payload in self.events.of(0, chunk)]

    def renumber(self, sent: int) -> None:
        """Chat chunks carry no sequence number."""


class _ChunkEvents:
    """The SSE payloads of a stream, chunk by chunk."""

    def __init__(self, gen: Generation, rid: str, tok: TokenizerLike) -> None:
        self.gen = gen
        self.rid = rid
        self.tok = tok
        self.offsets = [0] * gen.num_choices  # completions' text_offset per choice
        self.usage = UsageCounter(gen.n)
        self.streams = [MessageStream.of(gen) for _ in range(gen.num_choices)]
        # Plain text out (no logprobs, no tool calls or reasoning to parse): each event is
        # built as a dict in the models' layout, without a pydantic model per chunk (the
        # router's cost per streamed token; tests check both ways agree).
        self.plain = gen.top_logprobs is None and all(m is None for m in self.streams)

    def _envelope(
        self, choices: list[Any], chunk: common_pb2.GenerateChunk | None = None
    ) -> dict[str, Any]:
        """A payload; with continuous usage, a chunk's carries its choice's usage so far."""
        g = self.gen
        model: rs.ChatCompletionChunk | rs.Completion
        if g.chat:
            model = rs.ChatCompletionChunk(
                id=self.rid, created=g.created, model=g.model, choices=choices
            )
        else:
            model = rs.Completion(id=self.rid, created=g.created, model=g.model, choices=choices)
        if g.continuous_usage and chunk is not None:
            model.usage = choice_usage(chunk)
        elif g.include_usage or g.continuous_usage:
            model.usage = None
        return model.dump()

    def opening(self) -> list[dict[str, Any]]:
        g = self.gen
        if not g.chat:  # echo: each choice's text starts with its prompt
            if not g.echo:
                return []
            for i in range(g.num_choices):
                self.offsets[i] = len(g.echo[i // g.n])
            return [
                self._envelope(
                    [
                        rs.CompletionChoice(
                            index=i, text=g.echo[i // g.n], logprobs=None, finish_reason=None
                        )
                    ]
                )
                for i in range(g.num_choices)
            ]
        # OpenAI opens each chat choice with the role.
        return [
            self._envelope(
                [
                    rs.ChunkChoice(
                        index=i,
                        delta=rs.Delta(role="assistant", content=""),
                        logprobs=None,
                        finish_reason=None,
                    )
                ]
            )
            for i in range(self.gen.num_choices)
        ]

    def of(self, index: int, chunk: common_pb2.GenerateChunk) -> list[dict[str, Any]]:
        g = self.gen
        self.usage.add(index, chunk)
        reason = finish_reason(chunk)
        # With continuous usage or logprobs every chunk that brings tokens goes out, text
        # or not (a token of a character's first bytes has no text yet, but its logprob).
        counts = (g.continuous_usage or g.top_logprobs is not None) and bool(chunk.token_ids)
        if not chunk.text and reason is None and not counts:
            return []
        if self.plain:
            return [self._plain(index, chunk, reason)]
        choice: rs.ChunkChoice | rs.CompletionChoice
        if g.chat:
            delta, reason = self._delta(index, chunk.text, reason)
            lps = None
            if g.top_logprobs is not None:
                lps = rs.ChatLogprobs(content=chat_logprobs(chunk, self.tok))
            elif not delta.model_fields_set and reason is None and not counts:
                return []  # held back (a tool call or a marker in the making)
            choice = rs.ChunkChoice(index=index, delta=delta, logprobs=lps, finish_reason=reason)
        else:
            text_lps = None
            if g.top_logprobs is not None:
                text_lps = completion_logprobs(
                    chunk.logprobs, chunk.top_logprobs, self.tok, self.offsets[index]
                )
            choice = rs.CompletionChoice(
                index=index, text=chunk.text, logprobs=text_lps, finish_reason=reason
            )
        self.offsets[index] += len(chunk.text)
        return [self._envelope([choice], chunk)]

    def _plain(
        self, index: int, chunk: common_pb2.GenerateChunk, reason: rs.FinishReason | None
    ) -> dict[str, Any]:
        """`of`'s event for plain text, as the models would dump it."""
        g = self.gen
        text = chunk.text
        self.offsets[index] += len(text)
        choice: dict[str, Any]
        if g.chat:
            delta = {"content": text} if text else {}
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
        payload: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion.chunk" if g.chat else "text_completion",
            "created": g.created,
            "model": g.model,
            "choices": [choice],
        }
        if g.continuous_usage:
            payload["usage"] = {
                "prompt_tokens": chunk.prompt_tokens,
                "completion_tokens": chunk.completion_tokens,
                "total_tokens": chunk.prompt_tokens + chunk.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": chunk.cached_tokens},
            }
        elif g.include_usage:
            payload["usage"] = None
        return payload

    def _delta(
        self, index: int, text: str, reason: rs.FinishReason | None
    ) -> tuple[rs.Delta, rs.FinishReason | None]:
        stream = self.streams[index]
        if stream is None:
            return (rs.Delta(content=text) if text else rs.Delta()), reason
        part = stream.step(text, last=reason is not None)
        delta = rs.Delta()
        if part.content:
            delta.content = part.content
        if part.reasoning:
            delta.reasoning_content = part.reasoning
        if part.calls:
            delta.tool_calls = [
                rs.ToolCallDelta(
                    index=part.first_call + k,
                    id=call.id,
                    type="function",
                    function=rs.FunctionCallDelta(
                        name=call.function.name, arguments=call.function.arguments
                    ),
                )
                for k, call in enumerate(part.calls)
            ]
        if stream.num_calls and reason == "stop":
            reason = "tool_calls"
        return delta, reason

    def usage_event(self) -> dict[str, Any]:
        payload = self._envelope([])
        payload["usage"] = self.usage.usage().dump()
        return payload
