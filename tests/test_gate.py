"""The gRPC gate (radixmesh/gate.py) in front of a real grpc.aio server: the worker's
service, unattached (an authorized call gets UNAVAILABLE: it got past the key), behind
the API key interceptor that reports each call's outcome to the gate.

Keyless connections are raw HTTP/2 (h2): each finishes the handshake and may send keyless
calls; a flood comes from 127.0.0.2, clients with the key from 127.0.0.1. Every count
asserted follows from the caps; waits are for events (a connection closed, a count
reached), never for a time to pass, except the window.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from radixmesh import listener
from radixmesh.auth import ApiKeyInterceptor
from radixmesh.gate import Frames, Gate, KeylessCollector, goaway
from radixmesh.grpc_server import DecodeGuard
from radixmesh.listener import STRUCK, STRUCK_AT_ACCEPT, ListenerLimits, Tally
from radixmesh.v1 import worker_pb2, worker_pb2_grpc
from radixmesh.worker.server import ServerConfig, WorkerServicer

KEY = "gate-key"
GET_LOAD = "/radixmesh.v1.Worker/GetLoad"
FLOOD = "127.0.0.2"


@asynccontextmanager
async def gated(limits: ListenerLimits, max_connections: int = 10_000) -> AsyncIterator[Gate]:
    gate = Gate(limits, max_connections, Tally("test gate"))
    interceptor = ApiKeyInterceptor([KEY], on_outcome=gate.report)
    server = grpc.aio.server(interceptors=[DecodeGuard(), interceptor])
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(ServerConfig()), server)
    inner = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await gate.start("127.0.0.1", 0, inner)
    try:
        yield gate
    finally:
        await gate.close()
        await server.stop(None)


def port_of(gate: Gate) -> int:
    assert gate._server is not None
    return int(gate._server.sockets[0].getsockname()[1])


class Keyless:
    """A raw HTTP/2 client: the handshake, then calls without a key."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.goaway: int | None = None  # the last stream id a GOAWAY named
        self.statuses: dict[int, str] = {}  # stream -> grpc-status
        self.closed = False

    @classmethod
    async def open(cls, port: int, source: str = "127.0.0.1") -> Keyless:
        client = cls(*await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)))
        client.h2.initiate_connection()
        await client.flush()
        return client

    async def flush(self) -> None:
        self.writer.write(self.h2.data_to_send())
        await self.writer.drain()

    async def call(self, key: str | None = None) -> int:
        stream = self.h2.get_next_available_stream_id()
        headers = [
            (":method", "POST"), (":scheme", "http"), (":path", GET_LOAD),
            (":authority", "gate"), ("content-type", "application/grpc"), ("te", "trailers"),
        ]  # fmt: skip
        if key is not None:
            headers.append(("authorization", f"Bearer {key}"))
        self.h2.send_headers(stream, headers)
        self.h2.send_data(stream, b"\x00\x00\x00\x00\x00", end_stream=True)
        await self.flush()
        return stream

    async def read_until(self, done: Callable[[], bool]) -> None:
        """Read (answering what h2 must) until `done()` or the server closes."""
        while not done() and not self.closed:
            try:
                data = await self.reader.read(65536)
            except ConnectionResetError:  # closed at accept, before its preface was read
                data = b""
            if not data:
                self.closed = True
                return
            for event in self.h2.receive_data(data):
                if isinstance(event, h2.events.ConnectionTerminated):
                    self.goaway = event.last_stream_id
                elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    # An error is often trailers only: one HEADERS frame, its status in it.
                    fields = {bytes(k).decode(): bytes(v).decode() for k, v in event.headers}
                    if "grpc-status" in fields:
                        self.statuses[event.stream_id] = fields["grpc-status"]
            if not self.closed and (out := self.h2.data_to_send()):
                self.writer.write(out)

    def close(self) -> None:
        self.writer.close()


async def within(seconds: float, what: Awaitable[object]) -> None:
    await asyncio.wait_for(what, seconds)


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await within(seconds, poll())


async def get_load(port: int, key: str | None) -> grpc.StatusCode:
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=own) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        try:
            await stub.GetLoad(worker_pb2.GetLoadRequest(), metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def test_frames_follow_boundaries_and_streams() -> None:
    frames = Frames(preface=3)
    headers = (4).to_bytes(3, "big") + bytes([0x1, 0x4]) + (5).to_bytes(4, "big") + b"abcd"
    data = (2).to_bytes(3, "big") + bytes([0x0, 0x1]) + (5).to_bytes(4, "big") + b"xy"
    stream = b"PRI" + headers + data
    for i in range(len(stream)):  # one byte at a time: a header cut anywhere
        frames.feed(stream[i : i + 1])
        assert frames.between == (i + 1 in (3, 16, len(stream)))
    assert (frames.last_stream, frames.last_ended) == (5, 0)  # END_HEADERS, not END_STREAM
    assert goaway(7) == bytes.fromhex("000008 07 00 00000000 00000007 00000000".replace(" ", ""))


def test_keyless_connections_past_their_cap_evict_the_oldest_never_an_authenticated_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Places on probation are kept for the whole test (the grace that lets a newer
    # connection take the oldest one's place is a unit test's: tests/test_listener.py).
    monkeypatch.setattr(listener, "PROBATION_GRACE", 60.0)
    limits = ListenerLimits(keyless_connections=50, keyless_per_peer=50, auth_window=60.0)

    async def run() -> None:
        async with gated(limits) as gate:
            port = port_of(gate)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                metadata = (("authorization", f"Bearer {KEY}"),)

                async def authorized() -> grpc.StatusCode:
                    try:
                        await stub.GetLoad(worker_pb2.GetLoadRequest(), metadata=metadata)
                    except grpc.aio.AioRpcError as e:
                        return e.code()
                    return grpc.StatusCode.OK

                assert await authorized() == grpc.StatusCode.UNAVAILABLE  # past the key
                assert (gate.open, gate.keyless_open) == (1, 0)
                flood = [await Keyless.open(port, FLOOD) for _ in range(100)]
                # 1-50 held; 51-100 each evict the oldest: the address has had 50 closed
                # in the window, so it is struck.
                await until(lambda: sum(gate.closed.values()) == 50 and gate.open == 51)
                assert gate.keyless_open == 50
                assert dict(gate.closed) == {"evicted over keyless_per_peer": 50}
                evicted, kept = flood[:50], flood[50:]
                for client in evicted:
                    await within(5, client.read_until(lambda: False))
                    assert client.closed and client.goaway == 0
                # A client with the key behind the struck address gets in on probation (the
                # port's cap is full: the oldest keyless connection makes room) and stays.
                keyed = await Keyless.open(port, FLOOD)
                stream = await keyed.call(KEY)
                await within(5, keyed.read_until(lambda: stream in keyed.statuses))
                assert keyed.statuses[stream] == "14"  # UNAVAILABLE: past the key
                assert (gate.open, gate.keyless_open) == (51, 49)
                # 20 more from the struck address: 8 on probation (the first fills the
                # port's cap, 7 each evict its oldest), closed a second after their accept;
                # the other 12 are closed at accept.
                probation = [await Keyless.open(port, FLOOD) for _ in range(20)]
                await until(lambda: sum(gate.closed.values()) == 78 and gate.open == 44)
                assert dict(gate.closed) == {
                    "evicted over keyless_per_peer": 50,
                    "evicted over keyless_connections": 8,
                    STRUCK: 8,
                    STRUCK_AT_ACCEPT: 12,
                }
                assert gate.keyless_open == 42
                for client in (*kept[:8], *probation[:8]):
                    await within(5, client.read_until(lambda: False))
                    assert client.closed and client.goaway == 0
                for client in probation[8:]:
                    await within(5, client.read_until(lambda: False))
                    assert client.closed and client.goaway is None
                # The authorized connections were never candidates: each gets in again.
                assert await authorized() == grpc.StatusCode.UNAVAILABLE
                stream = await keyed.call(KEY)
                await within(5, keyed.read_until(lambda: stream in keyed.statuses))
                assert keyed.statuses[stream] == "14" and not keyed.closed
                assert gate.open == 44
                assert await get_load(port, KEY) == grpc.StatusCode.UNAVAILABLE
                assert sum(gate.closed.values()) == 78
                for client in (keyed, *kept[8:]):
                    client.close()

    asyncio.run(run())


def test_failed_calls_close_a_keyless_connection_with_goaway() -> None:
    limits = ListenerLimits(auth_failures=3, auth_window=60.0)

    async def run() -> None:
        async with gated(limits) as gate:
            client = await Keyless.open(port_of(gate))
            streams = []
            for _ in range(3):
                streams.append(await client.call())
                await within(5, client.read_until(lambda: streams[-1] in client.statuses))
            # Each call was answered UNAUTHENTICATED (16), the third one too, then GOAWAY
            # naming it and the close.
            assert client.statuses == {1: "16", 3: "16", 5: "16"}
            await within(5, client.read_until(lambda: False))
            assert client.closed and client.goaway == 5
            assert dict(gate.closed) == {"closed after auth_failures failed calls": 1}
            assert (gate.open, gate.keyless_open) == (0, 0)
            collected = {
                (m.name, tuple(s.labels.values()), s.value)
                for m in KeylessCollector({"grpc": gate}).collect()
                for s in m.samples
            }
            assert collected == {
                (
                    "radixmesh_listener_closed",
                    ("grpc", "closed after auth_failures failed calls"),
                    1,
                ),
                ("radixmesh_listener_keyless_connections", ("grpc",), 0),
            }

    asyncio.run(run())


def test_a_connection_without_a_key_in_the_window_is_closed() -> None:
    limits = ListenerLimits(auth_window=3.0)  # ample for the keyed call, on a busy machine

    async def run() -> None:
        async with gated(limits) as gate:
            port = port_of(gate)
            idle = await Keyless.open(port)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                metadata = (("authorization", f"Bearer {KEY}"),)
                with_key = stub.GetLoad(worker_pb2.GetLoadRequest(), metadata=metadata)
                try:
                    await with_key
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE
                await within(5, idle.read_until(lambda: False))
                assert idle.closed and idle.goaway == 0
                assert dict(gate.closed) == {"closed at auth_window without a key": 1}
                assert gate.open == 1  # the authenticated connection stays

    asyncio.run(run())


def test_over_max_connections_is_refused() -> None:
    async def run() -> None:
        async with gated(ListenerLimits(), max_connections=2) as gate:
            port = port_of(gate)
            first, second = await Keyless.open(port), await Keyless.open(port)
            third = await Keyless.open(port)
            await within(5, third.read_until(lambda: False))
            assert third.closed and third.goaway is None
            assert dict(gate.closed) == {"refused over max_connections": 1}
            assert gate.open == 2
            first.close()
            second.close()

    asyncio.run(run())
