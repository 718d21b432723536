"""The SDK resumes a stream whose router went away (client/resume.py), sync and asyncio,
against a scripted Router on loopback: its Generate sends two tokens and fails
UNAVAILABLE; its Resume sends the rest from the offset asked for."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from radixmesh.client import AsyncClient, Chunk, Client
from radixmesh.errors import OVERLOADED_METADATA_KEY, NotFound, Unavailable
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc

STREAM = "000000000000001f/" + "ab" * 16
TOKENS = [11, 12, 13, 14]


def _chunk(i: int, rid: str) -> common_pb2.GenerateChunk:
    chunk = common_pb2.GenerateChunk(
        request_id=rid, token_ids=[TOKENS[i]], text=f"<{i}>", completion_tokens=i + 1
    )
    if i == len(TOKENS) - 1:
        chunk.finish.reason = common_pb2.FINISH_REASON_LENGTH
    return chunk


class ScriptedRouter(router_pb2_grpc.RouterServicer):
    def __init__(self) -> None:
        self.resumes: list[tuple[str, int]] = []
        self.held = True  # whether "the worker" still holds the stream
        # The router's own UNAVAILABLE (a worker died: it names a retry-after), not the
        # transport's.
        self.worker_died = False
        self.sent = 2  # chunks Generate sends before it breaks

    def Generate(self, request: Any, context: Any) -> Iterator[Any]:
        for i in range(self.sent):
            yield router_pb2.RouterGenerateResponse(
                chunk=_chunk(i, request.request_id), worker_id="worker-0", stream_id=STREAM,
                offset=i + 1,
            )  # fmt: skip
        if self.worker_died:
            context.abort_with_status(_worker_died())
        context.abort(grpc.StatusCode.UNAVAILABLE, "the router is gone")

    def Resume(self, request: Any, context: Any) -> Iterator[Any]:
        self.resumes.append((request.stream_id, request.offset))
        if not self.held:
            context.abort(grpc.StatusCode.NOT_FOUND, "no stream is held here")
        for i in range(request.offset, len(TOKENS)):
            yield router_pb2.ResumeResponse(
                chunk=_chunk(i, request.stream_id), worker_id="worker-0",
                stream_id=request.stream_id, offset=i + 1,
            )  # fmt: skip


def _worker_died() -> Any:
    class Status(grpc.Status):
        code = grpc.StatusCode.UNAVAILABLE
        details = "worker-0 went away"
        trailing_metadata = ((OVERLOADED_METADATA_KEY, "1"),)

    return Status()


@pytest.fixture
def router() -> Iterator[tuple[str, ScriptedRouter]]:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    servicer = ScriptedRouter()
    router_pb2_grpc.add_RouterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


def _check(chunks: list[Chunk], servicer: ScriptedRouter) -> None:
    assert [t for c in chunks for t in c.token_ids] == TOKENS
    assert "".join(c.text for c in chunks) == "<0><1><2><3>"
    assert [c.offset for c in chunks] == [1, 2, 3, 4]
    assert {c.request_id for c in chunks} == {"mine"}  # the caller's id throughout
    assert {c.stream_id for c in chunks} == {STREAM}
    assert chunks[-1].finish_reason == "length"
    assert servicer.resumes == [(STREAM, 2)]


def test_the_sync_client_resumes_after_unavailable(router: tuple[str, ScriptedRouter]) -> None:
    address, servicer = router
    with Client(address, service="router", timeout=10) as client:
        chunks = list(client.generate("hi", request_id="mine", stream=True))
    _check(chunks, servicer)


def test_the_async_client_resumes_after_unavailable(router: tuple[str, ScriptedRouter]) -> None:
    address, servicer = router

    async def run() -> list[Chunk]:
        async with AsyncClient(address, service="router", timeout=10) as client:
            stream = await client.generate("hi", request_id="mine", stream=True)
            return [c async for c in stream]

    _check(asyncio.run(run()), servicer)


def test_a_stream_broken_after_its_last_chunk_ends_without_resuming(
    router: tuple[str, ScriptedRouter],
) -> None:
    """The router went away between the finish and the call's end: nothing is missing, so
    neither client resumes (a resume there used to wait for a chunk that never came)."""
    address, servicer = router
    servicer.sent = len(TOKENS)

    async def run() -> list[Chunk]:
        async with AsyncClient(address, service="router", timeout=10) as client:
            stream = await client.generate("hi", request_id="mine", stream=True)
            return [c async for c in stream]

    with Client(address, service="router", timeout=10) as client:
        synced = list(client.generate("hi", request_id="mine", stream=True))
    for chunks in (synced, asyncio.run(run())):
        assert [t for c in chunks for t in c.token_ids] == TOKENS
        assert [c.offset for c in chunks] == [1, 2, 3, 4]
        assert chunks[-1].finish_reason == "length"
    assert servicer.resumes == []


def test_a_broken_stream_no_worker_holds_is_unavailable(
    router: tuple[str, ScriptedRouter],
) -> None:
    address, servicer = router
    servicer.held = False
    got: list[Chunk] = []
    client = Client(address, service="router", timeout=10)
    with client, pytest.raises(Unavailable) as e:
        for chunk in client.generate("hi", request_id="mine", stream=True):
            got.append(chunk)
    assert [c.offset for c in got] == [1, 2]
    assert str(e.value) == (
        f"the stream {STREAM!r} broke after 2 tokens (the router is gone) and could not be "
        "resumed: no stream is held here"
    )
    assert servicer.resumes == [(STREAM, 2)]
    with Client(address, service="router", timeout=10) as again, pytest.raises(NotFound):
        list(again.resume(STREAM, 2))  # by hand: what the router said


CUT = (
    f"the stream {STREAM!r} broke after 2 tokens: its router went away (the router is "
    f"gone), and no retry or time was left to resume it; resume({STREAM!r}, 2) continues "
    "it while its worker holds it (the worker's grace period)"
)


def test_a_stream_not_resumed_raises_unavailable_naming_where_to_resume(
    router: tuple[str, ScriptedRouter],
) -> None:
    address, servicer = router
    got: list[Chunk] = []
    client = Client(address, service="router", timeout=10, max_retries=0)
    with client, pytest.raises(Unavailable) as e:
        for chunk in client.generate("hi", request_id="mine", stream=True):
            got.append(chunk)
    assert str(e.value) == CUT and e.value.grpc_status == "UNAVAILABLE"
    assert e.value.__cause__ is None and e.value.__suppress_context__  # not the transport's
    assert servicer.resumes == []
    with Client(address, service="router", timeout=10) as again:
        got += list(again.resume(STREAM, got[-1].offset))  # by hand, where it said
    assert [t for c in got for t in c.token_ids] == TOKENS


def test_the_async_client_not_resuming_raises_the_same(
    router: tuple[str, ScriptedRouter],
) -> None:
    address, _ = router

    async def run() -> None:
        async with AsyncClient(address, service="router", timeout=10, max_retries=0) as client:
            stream = await client.generate("hi", request_id="mine", stream=True)
            with pytest.raises(Unavailable) as e:
                async for _ in stream:
                    pass
            assert str(e.value) == CUT

    asyncio.run(run())


def test_a_stream_whose_worker_died_is_not_resumed(router: tuple[str, ScriptedRouter]) -> None:
    address, servicer = router
    servicer.worker_died = True
    with Client(address, service="router", timeout=10) as client, pytest.raises(Unavailable) as e:
        list(client.generate("hi", request_id="mine", stream=True))
    assert str(e.value) == "worker-0 went away"
    assert servicer.resumes == []


def test_resume_by_hand_from_an_offset(router: tuple[str, ScriptedRouter]) -> None:
    address, servicer = router
    with Client(address, service="router", timeout=10) as client:
        chunks = list(client.resume(STREAM, 3))
    assert [c.token_ids for c in chunks] == [[TOKENS[3]]]
    assert servicer.resumes == [(STREAM, 3)]
