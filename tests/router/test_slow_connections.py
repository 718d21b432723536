"""Slow, idle and surplus connections against a real router (one dummy:tiny worker behind
it) with small connection limits: 150 per port, 100 per peer address, 5 s for a request
head or body (radixmesh/listener.py, router/http/listener.py).

Against the HTTP port: 100 connections from one address (40 silent, 30 trickling a head a
byte a second, 30 with a head that never ends), one more from it (past the per-peer cap),
49 from a second address (10 trickling a body, 39 silent) and 10 more (past the total cap).
Against the gRPC port: 160 silent sockets. Meanwhile a client that connected first (its
own address) sends HTTP and gRPC requests. Every state asserted follows from the limits
with seconds of margin: a refusal is a 503 written at accept, the timeouts are 5 s and the
checks come at about 1 s and 9 s.

And a listener run with fewer descriptors than its cap, so that accept() fails with EMFILE:
its log holds one line about it, not one traceback per failed call. Likewise malformed
requests and clients that leave mid-body: counted, not a traceback each.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.errors import InvalidArgument
from radixmesh.listener import ListenerLimits, connection_cap
from radixmesh.router.config import RouterConfig
from tests.router.routers import ExtraRouter

TIMEOUT = 4.0  # header and body
CAP, PER_PEER = 150, 100
FLOOD, NORMAL_PEER = "127.0.0.1", "127.0.0.9"  # the normal client's own address
SECOND = "127.0.0.2"
REFUSED = b"HTTP/1.1 503 Service Unavailable\r\n"
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\n"


# ---- the limits as configuration -------------------------------------------------------------


def test_limits_are_router_flags_that_launch_passes_on() -> None:
    from radixmesh.cluster.cli import build_parser
    from radixmesh.cluster.router_flags import router_options

    argv = ["launch", "--model", "dummy:tiny", "--header-timeout", "2.5"]
    argv += ["--max-connections", "7", "--max-connections-per-peer", "0"]
    options = router_options(build_parser().parse_args(argv), launch=True)
    assert options == {"header_timeout": 2.5, "max_connections": 7, "max_connections_per_peer": 0}
    spec = LaunchSpec(model="dummy:tiny", router_options=options)
    assert spec.router_flags() == [
        "--header-timeout", "2.5", "--max-connections", "7", "--max-connections-per-peer", "0"
    ]  # fmt: skip
    limits = spec.router_config(("127.0.0.1:1",)).listener_limits
    assert limits == ListenerLimits(2.5, 60.0, 75.0, 7, 0)
    for field, value in (("body_timeout", 0.0), ("idle_timeout", float("inf"))):
        with pytest.raises(InvalidArgument) as e:
            RouterConfig(workers=("127.0.0.1:1",), **{field: value})  # type: ignore[arg-type]
        assert e.value.field == field
    with pytest.raises(InvalidArgument) as e:
        RouterConfig(workers=("127.0.0.1:1",), max_connections=-1)
    assert e.value.field == "max_connections"


def test_the_cap_is_a_share_of_the_descriptors_unless_set() -> None:
    # 20,000 descriptors, 1,024 kept back, two ports: 9,488 each.
    assert connection_cap(ListenerLimits(), 2, 20_000) == 9_488
    assert connection_cap(ListenerLimits(), 1, 1_024) == 768  # a quarter kept back
    assert connection_cap(ListenerLimits(max_connections=5), 2, 20_000) == 5


# ---- a flood against a router ------------------------------------------------------------------


class Probe:
    """A raw client socket that records what it received and whether the server closed
    it; `payload` is trickled a byte a second by `tick`."""

    def __init__(self, port: int, source: str, sent: bytes = b"", payload: bytes = b"") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
        self.sock.setblocking(False)
        if sent:
            self.sock.sendall(sent)
        self.payload = payload
        self.received = b""
        self.closed = False

    def poll(self) -> Probe:
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                break
            except OSError:  # a reset: the server closed while we trickled
                data = b""
            self.received += data
            self.closed = not data
        return self

    def tick(self) -> None:
        if self.payload and not self.poll().closed:
            try:
                self.sock.send(self.payload[:1])
                self.payload = self.payload[1:]
            except OSError:
                self.closed = True

    def close(self) -> None:
        self.sock.close()


def wait_for(condition: Callable[[], bool], timeout: float, every: Callable[[], None]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the state did not come in time"
        every()
        time.sleep(0.05)


class NormalClient:
    """A client connected before the flood, on its own address: one completion over a
    kept-alive HTTP connection and one over gRPC per `request()`."""

    def __init__(self, http_port: int, grpc_address: str) -> None:
        from radixmesh.client import Client

        self.http = http.client.HTTPConnection(
            "127.0.0.1", http_port, timeout=30, source_address=(NORMAL_PEER, 0)
        )
        self.client = Client(grpc_address)
        self.served = 0

    def request(self) -> None:
        body = {"model": "dummy:tiny", "prompt": "hello", "max_tokens": 2, "ignore_eos": True}
        self.http.request("POST", "/v1/completions", json.dumps(body).encode())
        resp = self.http.getresponse()
        text = resp.read()
        assert resp.status == 200, text
        assert json.loads(text)["usage"]["completion_tokens"] == 2
        params = {"max_new_tokens": 2, "ignore_eos": True}
        assert len(self.client.generate("hello", sampling_params=params).token_ids) == 2
        self.served += 1

    def close(self) -> None:
        self.http.close()
        self.client.close()


@pytest.fixture(scope="module")
def worker() -> Iterator[LocalCluster]:
    spec = LaunchSpec(
        model="dummy:tiny",
        workers=1,
        port=free_port(),
        worker_args=("--dtype", "float32", "--no-engine-process"),
    )
    cluster = LocalCluster(spec)
    cluster.start_workers()  # the routers are the tests'
    try:
        yield cluster
    finally:
        cluster.stop()


def test_slow_idle_and_surplus_connections_are_refused_or_closed(
    worker: LocalCluster, tmp_path: Path
) -> None:
    log = tmp_path / "router.log"
    flags = ["--header-timeout", str(TIMEOUT), "--body-timeout", str(TIMEOUT)]
    flags += ["--idle-timeout", "30", "--max-connections", str(CAP)]
    flags += ["--max-connections-per-peer", str(PER_PEER)]
    with ExtraRouter(worker, *flags, http=True, log=log) as router:
        assert router.http_port is not None
        port, grpc_port = router.http_port, int(router.address.rsplit(":", 1)[1])
        normal = NormalClient(port, router.address)
        try:
            normal.request()
            _flood_and_check(port, grpc_port, normal)
        finally:
            normal.close()
    lines = log.read_text().splitlines()
    tallies = Counter[str]()
    for line in lines:
        if "radixmesh.listener" in line and f"HTTP port {port}, in " in line:
            for part in line.split(" s: ", 1)[1].split(", "):
                n, what = part.split(" ", 1)
                tallies[what] += int(n)
    assert tallies == {
        "closed at header_timeout": 139,  # 100 from the first address, 39 from the second
        "closed at body_timeout": 10,
        "refused over max_connections": 10,
        "refused over max_connections_per_peer": 2,  # one in the flood, one after
        "malformed requests (400)": 20,
    }
    # 520 connections refused or closed: a few summary lines, no line per connection.
    print(f"router log: {len(lines)} lines, {log.stat().st_size} bytes", *lines, sep="\n")
    assert len(lines) <= 12, "\n".join(lines)
    assert not any("Traceback" in line for line in lines)


def _flood_and_check(port: int, grpc_port: int, normal: NormalClient) -> None:
    silent = [Probe(port, FLOOD) for _ in range(40)]
    trickling = [
        Probe(port, FLOOD, payload=b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(30)
    ]
    unfinished = [
        Probe(port, FLOOD, sent=b"GET /health HTTP/1.1\r\nHost: x\r\n") for _ in range(30)
    ]
    over_peer = Probe(port, FLOOD)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: 64\r\n\r\n"
    bodies = [Probe(port, SECOND, sent=head, payload=b" " * 64) for _ in range(10)]
    silent_second = [Probe(port, SECOND) for _ in range(39)]
    over_total = [Probe(port, SECOND) for _ in range(10)]
    raw_grpc = [Probe(grpc_port, FLOOD) for _ in range(160)]
    flooded = time.monotonic()
    admitted = silent + trickling + unfinished + bodies + silent_second
    tricklers = trickling + bodies

    def tick() -> None:
        for p in tricklers:
            p.tick()

    # Past a cap: a 503 with Retry-After written at accept, then the server's end closed.
    refused = [over_peer, *over_total]
    wait_for(lambda: all(p.poll().closed for p in refused), 5.0, tick)
    for p in refused:
        assert p.received.startswith(REFUSED) and b"Retry-After: 1\r\n" in p.received
    normal.request()  # both ports are at their caps: the client connected first is served
    tick()
    normal.request()
    # About 1 s in, 4 s before any timeout: every admitted connection is open and unanswered.
    assert time.monotonic() - flooded < TIMEOUT - 1.0
    assert all(not p.poll().closed and not p.received for p in admitted)
    closed_grpc = [p for p in raw_grpc if p.poll().closed and not p.received]
    assert CAP - 5 <= len(raw_grpc) - len(closed_grpc) <= CAP  # the rest: closed at accept
    # Past the timeouts (5 s, with 4 s of margin), each connection is closed; the silent
    # ones and the unfinished heads with a 408, the gRPC sockets with grpc-core's GOAWAY.
    deadline = flooded + TIMEOUT + 4.0
    while time.monotonic() < deadline:
        tick()
        normal.request()
        time.sleep(0.3)
    assert all(p.poll().closed for p in admitted + raw_grpc)
    assert all(p.received.startswith(TIMED_OUT) for p in silent + unfinished + silent_second)
    assert all(p.received.startswith(TIMED_OUT) for p in tricklers if p.received)
    settings = b"Did not receive HTTP/2 settings before handshake timeout"
    assert all(settings in p.received for p in raw_grpc if p not in closed_grpc)
    for p in admitted + refused + raw_grpc:
        p.close()
    # Every count came back: the first address has its 100 connections again, not 101.
    again = [Probe(port, FLOOD) for _ in range(PER_PEER + 1)]
    wait_for(lambda: again[-1].poll().closed, 5.0, lambda: None)
    assert again[-1].received.startswith(REFUSED)
    assert all(not p.poll().closed for p in again[:-1])
    for p in again:
        p.close()
    # Malformed heads (400) and clients gone mid-body: no traceback each, only counts.
    bad = [Probe(port, NORMAL_PEER, sent=b"GET / HTTP/1.1\r\nNo colon\r\n\r\n") for _ in range(20)]
    gone = [Probe(port, NORMAL_PEER, sent=head + b"{") for _ in range(20)]
    wait_for(lambda: all(p.poll().closed for p in bad), 5.0, lambda: None)
    assert all(p.received.startswith(b"HTTP/1.0 400 Bad Request\r\n") for p in bad)
    time.sleep(0.5)  # the heads are read, the bodies awaited
    for p in bad + gone:
        p.close()
    normal.request()
    print(f"{normal.served} normal HTTP + gRPC requests served during the flood")


# ---- accept() failing ------------------------------------------------------------------------

# A guarded HTTP listener (no router: only the listener matters here) in a process with 64
# descriptors and a cap of 1,000: accept() fails with EMFILE once the descriptors are gone.
# It serves until its stdin closes, then stops (flushing its tally).
_LISTENER = """
import asyncio, logging, resource, sys
from aiohttp import web
from radixmesh.listener import AcceptErrors, ListenerLimits, Tally
from radixmesh.router.http.listener import ConnectionGuard, GuardedSite

async def main():
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = web.Application()
    app.router.add_get("/", lambda request: web.Response(text="ok"))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    tally = Tally("HTTP")
    guard = ConnectionGuard(ListenerLimits(header_timeout=60), 1000, runner.server, tally)
    site = GuardedSite(runner, "127.0.0.1", 0, guard)
    await site.start()
    AcceptErrors(tally).install(asyncio.get_running_loop())
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    print(runner.addresses[0][1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()

asyncio.run(main())
"""


def test_failed_accepts_are_one_log_line() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _LISTENER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    started = time.monotonic()
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(120)]
        time.sleep(1.5)  # accept() fails, and is retried a second later
        for s in socks:
            s.close()
        # The descriptors are back: a request is served.
        wait_for(lambda: _get(port) == b"ok", 10.0, lambda: None)
        _, err = proc.communicate(b"", timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.decode().splitlines()
    # One summary line per 10 s (one, unless this machine is slow), nothing else: without
    # the handler, each failed accept() is a traceback (some 1,200-1,600 lines here).
    assert 1 <= len(lines) <= 1 + (time.monotonic() - started) // 10, lines
    assert all(line.startswith("WARNING radixmesh.listener: HTTP, in ") for line in lines)
    assert "failed accept() (EMFILE)" in lines[0]


def _get(port: int) -> bytes | None:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/")
        body = conn.getresponse().read()
        conn.close()
        return body
    except OSError:
        return None
