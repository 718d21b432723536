"""The worker's stored responses: per caller, bounded by count and bytes, expiring."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from radixmesh.errors import FIELD_METADATA_KEY, InvalidArgument
from radixmesh.v1 import worker_pb2, worker_pb2_grpc
from radixmesh.worker.server import ServerConfig, WorkerServicer
from radixmesh.worker.stored_responses import (
    ENTRY_OVERHEAD,
    StoredResponseLimits,
    StoredResponses,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def store(**limits: float) -> tuple[StoredResponses, Clock]:
    clock = Clock()
    return StoredResponses(StoredResponseLimits(**limits), clock), clock  # type: ignore[arg-type]


def size(caller: str, rid: str, value: bytes) -> int:
    return len(caller) + len(rid) + len(value) + ENTRY_OVERHEAD


def test_put_get_delete_per_caller() -> None:
    s, _ = store()
    assert s.put("a", "resp_1", b'{"x": 1}', 60.0)
    assert s.get("a", "resp_1") == b'{"x": 1}'
    assert s.get("b", "resp_1") is None  # another caller's reads as unknown
    assert not s.delete("b", "resp_1")
    assert s.delete("a", "resp_1")
    assert s.get("a", "resp_1") is None
    assert not s.delete("a", "resp_1")
    assert (len(s), s.bytes) == (0, 0)


def test_expiry_per_entry_capped_at_max_ttl() -> None:
    s, clock = store(max_ttl=50.0)
    s.put("a", "long", b"1", 3600.0)  # capped: 50 s
    s.put("a", "short", b"2", 10.0)
    clock.now += 10.0
    assert s.get("a", "short") is None  # expired at once, though not first in order
    assert s.get("a", "long") == b"1"
    assert len(s) == 1
    clock.now += 40.0
    assert s.get("a", "long") is None
    assert (len(s), s.bytes) == (0, 0)


def test_bounds_drop_the_oldest() -> None:
    one = size("a", "r0", b"x" * 100)
    s, _ = store(max_entries=3, max_bytes=3 * one)
    for i in range(4):
        assert s.put("a", f"r{i}", b"x" * 100, 60.0)
    assert [s.get("a", f"r{i}") is not None for i in range(4)] == [False, True, True, True]
    assert (len(s), s.bytes) == (3, 3 * one)
    assert s.put("a", "big", b"y" * (one + 1), 60.0)  # needs two entries' room
    assert [s.get("a", f"r{i}") is not None for i in range(4)] == [False, False, False, True]
    assert not s.put("a", "huge", b"z" * (3 * one), 60.0)  # alone over max_bytes
    assert s.get("a", "r3") is not None  # a refused put drops nothing


def test_bad_input_names_the_field() -> None:
    s, _ = store()
    with pytest.raises(InvalidArgument) as e:
        s.put("a", "", b"", 1.0)
    assert e.value.field == "response_id"
    for ttl in (0.0, -1.0, float("nan")):
        with pytest.raises(InvalidArgument) as e:
            s.put("a", "r", b"", ttl)
        assert e.value.field == "ttl_seconds"
    with pytest.raises(InvalidArgument) as e:
        StoredResponseLimits(max_ttl=0)
    assert e.value.field == "max_ttl"


def test_the_rpcs_on_loopback() -> None:
    """The Worker service's three RPCs over a real gRPC server (no model needed): what
    one router puts, another reads and deletes; bad input is INVALID_ARGUMENT naming the
    field."""

    async def run() -> None:
        server = grpc.aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(ServerConfig()), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        a = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        b = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            put = worker_pb2.PutStoredResponseRequest(
                caller="c", response_id="resp_1", entry=b'{"a":1}', ttl_seconds=60
            )
            assert (await worker_pb2_grpc.WorkerStub(a).PutStoredResponse(put)).stored
            stub = worker_pb2_grpc.WorkerStub(b)
            get = worker_pb2.GetStoredResponseRequest(caller="c", response_id="resp_1")
            got = await stub.GetStoredResponse(get)
            assert (got.found, got.entry) == (True, b'{"a":1}')
            other = worker_pb2.GetStoredResponseRequest(caller="d", response_id="resp_1")
            assert not (await stub.GetStoredResponse(other)).found
            delete = worker_pb2.DeleteStoredResponseRequest(caller="c", response_id="resp_1")
            assert (await stub.DeleteStoredResponse(delete)).deleted
            assert not (await stub.DeleteStoredResponse(delete)).deleted
            assert not (await stub.GetStoredResponse(get)).found
            no_id = worker_pb2.PutStoredResponseRequest(caller="c", entry=b"{}", ttl_seconds=1)
            no_ttl = worker_pb2.PutStoredResponseRequest(caller="c", response_id="r", entry=b"")
            for request, field in ((no_id, "response_id"), (no_ttl, "ttl_seconds")):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.PutStoredResponse(request)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert (FIELD_METADATA_KEY, field) in tuple(e.value.trailing_metadata() or ())
        finally:
            await a.close()
            await b.close()
            await server.stop(None)

    asyncio.run(run())
