"""Server-sent events with names (`event: <name>` then `data: <json>`), as Anthropic's
Messages API and OpenAI's Responses API stream (chat completions send `data:` only).

The 200 and its headers go out with the first event: a handler waits for the worker's
first chunk (`first_chunk`) before opening the stream, so errors until then get their
own HTTP status, naming the field in the API's spelling.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

import grpc
from aiohttp import web

from radixmesh.errors import RadixMeshError, Unavailable
from radixmesh.router.http.api_error import ApiError
from radixmesh.router.http.openai.generation import WORKER_HEADER
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
        if workers:
            headers[WORKER_HEADER] = ",".join(sorted(workers))
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        return cls(resp)

    async def send(self, name: str, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        await self.resp.write(b"event: " + name.encode() + b"\ndata: " + data + b"\n\n")

    async def send_all(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        for name, payload in events:
            await self.send(name, payload)

    async def close(self) -> None:
        await self.resp.write_eof()
