"""Keyless connections at the router's HTTP port (router/http/listener.py): the real HTTP
front end in-process, with an API key and no reachable worker (a request with the key
gets past the key check and is answered 503: the router is still starting).

Clients are raw HTTP/1.1 sockets: a flood from 127.0.0.2, the others from 127.0.0.1.
Every count asserted follows from the caps; waits are for events (a connection closed, a
count reached), never for a time to pass, except the window's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from radixmesh import listener
from radixmesh.listener import STRUCK, STRUCK_AT_ACCEPT
from radixmesh.router.config import RouterConfig
from radixmesh.router.control import ControlPlane
from radixmesh.router.dispatch import Dispatcher
from radixmesh.router.http.app import HttpFrontend
from radixmesh.router.http.listener import ConnectionGuard
from radixmesh.router.metrics import RouterMetrics
from radixmesh.router.pool import WorkerPool

KEY = "http-key"
FLOOD = "127.0.0.2"


@asynccontextmanager
async def frontend(**limits: Any) -> AsyncIterator[tuple[int, ConnectionGuard]]:
    config = RouterConfig(workers=("127.0.0.1:9",), api_keys=(KEY,), **limits)
    pool = WorkerPool(config)
    metrics = RouterMetrics(pool)
    control = ControlPlane(config, pool, metrics)
    http = HttpFrontend(Dispatcher(config, control, metrics), control, config)
    port = await http.start("127.0.0.1", 0)
    assert http.guard is not None
    try:
        yield port, http.guard
    finally:
        await http.stop()
        await pool.close()


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, source: str = "127.0.0.1") -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)))

    async def get(self, key: str | None) -> tuple[int, dict[str, str]]:
        """GET /v1/models on this connection: the status and the headers (lower-cased)."""
        auth = f"Authorization: Bearer {key}\r\n" if key else ""
        self.writer.write(f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
        head = (await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)).decode()
        lines = head.split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
        await self.reader.readexactly(int(headers["content-length"]))
        return int(lines[0].split()[1]), headers

    async def closed(self) -> bool:
        """Whether the server closed the connection (waits up to 5 s for it)."""
        try:
            return await asyncio.wait_for(self.reader.read(1), 5) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.writer.close()


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), seconds)


def test_keyless_connections_past_their_cap_evict_the_oldest_never_an_authenticated_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Places on probation are kept for the whole test (the grace that lets a newer
    # connection take the oldest one's place is a unit test's: tests/test_listener.py).
    monkeypatch.setattr(listener, "PROBATION_GRACE", 60.0)

    async def run() -> None:
        async with frontend(keyless_connections=50, keyless_per_peer=50) as (port, guard):
            keyed = await Client.open(port)
            assert (await keyed.get(KEY))[0] == 503  # past the key: no worker yet
            flood = [await Client.open(port, FLOOD) for _ in range(100)]
            # 1-50 held; 51-100 each evict the oldest: the address has had 50 closed in
            # the window, so it is struck.
            await until(lambda: sum(guard.closed.values()) == 50 and guard.open == 51)
            assert guard.keyless_open == 50
            assert dict(guard.closed) == {"evicted over keyless_per_peer": 50}
            for client in flood[:50]:
                assert await client.closed()
            # A client with the key behind the struck address gets in on probation (the
            # port's cap is full: the oldest keyless connection makes room) and stays.
            behind = await Client.open(port, FLOOD)
            assert (await behind.get(KEY))[0] == 503
            assert (guard.open, guard.keyless_open) == (51, 49)
            # 20 more from the struck address: 8 on probation (the first fills the port's
            # cap, 7 each evict its oldest), closed a second after their accept; the other
            # 12 are closed at accept (HTTP: 503).
            probation = [await Client.open(port, FLOOD) for _ in range(20)]
            await until(lambda: sum(guard.closed.values()) == 78 and guard.open == 44)
            assert dict(guard.closed) == {
                "evicted over keyless_per_peer": 50,
                "evicted over keyless_connections": 8,
                STRUCK: 8,
                STRUCK_AT_ACCEPT: 12,
            }
            assert guard.keyless_open == 42
            for client in (*flood[50:58], *probation[:8]):
                assert await client.closed()
            for client in probation[8:]:
                assert (await client.reader.read())[:12] == b"HTTP/1.1 503"
            # Authenticated, never candidates: the same connections are served again.
            for client in (keyed, behind):
                status, headers = await client.get(KEY)
                assert (status, headers.get("connection")) == (503, None)
            # A new client with the key (another address) gets in.
            fresh = await Client.open(port)
            assert (await fresh.get(KEY))[0] == 503
            assert sum(guard.closed.values()) == 78
            for client in (keyed, behind, fresh, *flood[58:]):
                client.close()

    asyncio.run(run())


def test_401s_close_a_keyless_connection() -> None:
    async def run() -> None:
        async with frontend(auth_failures=3) as (port, guard):
            client = await Client.open(port)
            answers = [await client.get("wrong") for _ in range(3)]
            assert [(s, h.get("connection")) for s, h in answers] == [
                (401, None), (401, None), (401, "close")
            ]  # fmt: skip
            assert await client.closed()
            assert dict(guard.closed) == {"closed after auth_failures 401s": 1}
            # One that authenticated is not closed for its 401s.
            keyed = await Client.open(port)
            assert (await keyed.get(KEY))[0] == 503
            statuses = [(await keyed.get(None))[0] for _ in range(3)]
            assert statuses == [401, 401, 401]
            assert (await keyed.get(KEY))[0] == 503
            assert (guard.open, guard.keyless_open) == (1, 0)
            keyed.close()

    asyncio.run(run())


def test_a_connection_without_a_key_in_the_window_is_closed() -> None:
    async def run() -> None:
        async with frontend(auth_window=3.0) as (port, guard):  # ample for the keyed call
            idle, keyed = await Client.open(port), await Client.open(port)
            assert (await keyed.get(KEY))[0] == 503
            assert await idle.closed()
            assert dict(guard.closed) == {"closed at auth_window without a key": 1}
            assert (await keyed.get(KEY))[0] == 503
            keyed.close()

    asyncio.run(run())
