"""Server-sent events with names (`event: <name>` then `data: <json>`), as Anthropic's
Messages API and OpenAI's Responses API stream (chat completions send `data:` only).

The 200 and its headers go out with the first event: a handler waits for the worker's
first chunk (`first_chunk`) before opening the stream, so errors until then get their
own HTTP status, naming the field in the API's spelling. A stream that resumes has an
`id:` on every event (event_ids.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

import grpc
from aiohttp import web

from radixmesh.errors import RadixMeshError, Unavailable
from radixmesh.router.http.api_error import ApiError
from radixmesh.router.http.event_ids import IdentifiedEvents, SseEvent
from radixmesh.router.http.openai.generation import ROUTER_HEADER, WORKER_HEADER
from radixmesh.router.service import ROUTER_ID
from radixmesh.v1 import common_pb2


async def first_chunk(
    chunks: AsyncGenerator[tuple[int, common_pb2.GenerateChunk], None],
    field_name: Callable[[str], str],
) -> common_pb2.GenerateChunk:
    """The first chunk of a one-choice generation; an error before it is an ApiError whose
    field `field_name` renames (a worker names SamplingParams fields)."""
    try:
        item = await anext(chunks, None)
    except (RadixMeshError, ValueError, grpc.aio.AioRpcError) as e:
        raise ApiError.from_exception(e, field_name) from e
    if item is None:
        raise Unavailable("the worker ended the request without output")
    return item[1]


class EventStream:
    def __init__(self, resp: web.StreamResponse) -> None:
        self.resp = resp

    @classmethod
    async def open(cls, request: web.Request, workers: set[str]) -> EventStream:
        """The response, prepared; `workers`: the serving workers, named in a header."""
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        headers[ROUTER_HEADER] = ROUTER_ID
        if workers:
            headers[WORKER_HEADER] = ",".join(sorted(workers))
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        return cls(resp)

    async def send(self, name: str, payload: dict[str, Any], event_id: str | None = None) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        tail = b"" if event_id is None else b"\nid: " + event_id.encode()
        await self.resp.write(b"event: " + name.encode() + b"\ndata: " + data + tail + b"\n\n")

    async def relay(
        self,
        events: IdentifiedEvents,
        first: common_pb2.GenerateChunk,
        chunks: AsyncGenerator[tuple[int, common_pb2.GenerateChunk], None],
    ) -> None:
        """The reply's events of `first` and of the chunks after it, with their ids."""
        await self._send_all(events.of(first))
        async for _, chunk in chunks:
            await self._send_all(events.of(chunk))

    async def _send_all(self, events: list[tuple[SseEvent, str | None]]) -> None:
        for (name, payload), event_id in events:
            await self.send(name, payload, event_id)

    async def close(self) -> None:
        await self.resp.write_eof()
