"""Junk-authorization flood: how much a client's junk adds to a cluster's logs.

Starts a worker (dummy:tiny) and a router, each a process of its own with its log (stdout
and stderr, the worker's engine process included) in a file, with API, admin and worker
keys set; then makes `--calls` calls, each carrying a 4 KB junk `authorization` value,
in turn of four kinds (`--rate` a second, else back to back):

- `grpc-router`, `grpc-worker`: raw HTTP/2 to the router's and the worker's gRPC port,
  `authorization: Basic <junk>\\xff` (not UTF-8: gRPC's "Invalid encoding" ERROR, with a
  traceback, once per call before log_limit.py);
- `http-malformed`: the router's HTTP port, `Authorization: Basic <junk>\\x0b` (aiohttp
  cannot parse it: a 400);
- `http-wrong`: the router's HTTP port, `Authorization: Bearer <junk>` (a wrong key: 401).

The processes are stopped (SIGTERM) before the logs are read, so the counts that
log_limit.py writes at exit are in. Prints a table and writes JSON to bench/results/:
the calls' answers, each log's growth in bytes and lines, the seconds the flood took.

    python -m bench.log_flood --calls 2000
    python -m bench.log_flood --calls 2000 --rate 40  # over 50 s: five intervals
    python -m bench.log_flood --calls 500 --source /tmp/old-tree  # the same, older code
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events

from bench import record

KINDS = ("grpc-router", "grpc-worker", "http-malformed", "http-wrong")
JUNK = (b"Zq3xW9vLmP0aRt7yK2nB5cDe8fGh" * 147)[:4096]  # 4 KB of a key's alphabet


@dataclass(frozen=True)
class Keys:
    """The cluster's keys: two client (API) keys, an admin key, the workers' key."""

    clients: tuple[str, ...] = ("rmk-Qv7Tx2LpWz9Kd4Hs", "rmk-Jc5Nb8RfYm3Ga6Ue")
    admin: str = "rmk-admin-Xe4Wq9Pz7Lk2"
    worker: str = "rmk-worker-Vb6Ht3Ns8Jd5"

    @property
    def all(self) -> tuple[str, ...]:
        return (*self.clients, self.admin, self.worker)


@dataclass
class Cluster:
    """A running worker and router: their ports and log files."""

    worker_port: int
    grpc_port: int
    http_port: int
    logs: dict[str, Path]  # "router" / "worker" -> its log
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        return {name: path.stat().st_size for name, path in self.logs.items()}

    def stop(self) -> None:
        """SIGTERM, router first; every process waited for (its exit flushes its log)."""
        for name in ("router", "worker"):
            proc = self.procs.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def cluster(
    directory: Path,
    keys: Keys = Keys(),
    source: str | None = None,
    timeout: float = 120.0,
    router_args: tuple[str, ...] = (),
) -> Iterator[Cluster]:
    """A worker and a router (with `router_args`) serving (the router's /health answers
    200); stopped at the end. `source`: a source tree to run instead of this one. A
    process that exits while starting (a free port taken meanwhile by another program) is
    started again on other ports, up to ATTEMPTS times."""
    for attempt in range(1, ATTEMPTS + 1):
        c = _start(directory, keys, source, router_args)
        try:
            _wait_serving(c, timeout)
        except _Exited:
            c.stop()
            if attempt == ATTEMPTS:
                raise
            continue
        except BaseException:
            c.stop()
            raise
        try:
            yield c
        finally:
            c.stop()
        return


ATTEMPTS = 3


class _Exited(RuntimeError):
    """A process of the cluster exited while it started."""


def _start(
    directory: Path, keys: Keys, source: str | None, router_args: tuple[str, ...]
) -> Cluster:
    c = Cluster(free_port(), free_port(), free_port(), {})
    env = {**os.environ, "RADIXMESH_API_KEY": keys.worker}
    if source:
        env["PYTHONPATH"] = source
    cli = [sys.executable, "-m", "radixmesh.cluster.cli"]
    worker = [*cli, "worker", "--model", "dummy:tiny", "--host", "127.0.0.1"]
    worker += ["--port", str(c.worker_port)]
    router = [*cli, "router", "--host", "127.0.0.1", "--workers", f"127.0.0.1:{c.worker_port}"]
    router += ["--port", str(c.grpc_port), "--http-port", str(c.http_port), *router_args]
    router_env = {**env, "RADIXMESH_API_KEY": ",".join(keys.clients)}
    router_env |= {"RADIXMESH_ADMIN_KEY": keys.admin, "RADIXMESH_WORKER_API_KEY": keys.worker}
    for name, cmd, e in (("worker", worker, env), ("router", router, router_env)):
        c.logs[name] = directory / f"{name}.log"
        with c.logs[name].open("wb") as log:
            c.procs[name] = subprocess.Popen(
                cmd, env=e, stdout=log, stderr=subprocess.STDOUT, cwd=source
            )
    return c


def _wait_serving(c: Cluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{c.http_port}/health"
    while True:
        for name, proc in c.procs.items():
            if proc.poll() is not None:
                raise _Exited(f"the {name} exited: {c.logs[name].read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the cluster did not serve in time")
        time.sleep(0.2)


# ---- raw calls ----------------------------------------------------------------------------


def http_raw(port: int, request: bytes) -> int | None:
    """`request` as is on a new connection: the reply's status (None: no reply)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while b"\r\n" not in data:
            more = s.recv(65536)
            if not more:
                break
            data += more
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def http_request(method: str, path: str, headers: bytes, body: bytes = b"") -> bytes:
    """An HTTP/1.1 request's bytes with `headers` (CRLF-separated lines) as given."""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n".encode()
    if body:
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    return head + headers + b"\r\n\r\n" + body


def grpc_raw(port: int, path: str, metadata: list[tuple[bytes, bytes]]) -> int | None:
    """One unary call on `path` with `metadata` as is (raw HTTP/2 frames) and an empty
    message: its grpc-status (None: the stream or connection was reset)."""
    config = h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
    )
    conn = h2.connection.H2Connection(config)
    headers = [
        (b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"127.0.0.1"),
        (b":path", path.encode()), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
        *metadata,
    ]  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        conn.initiate_connection()
        conn.send_headers(1, headers)
        conn.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
        s.sendall(conn.data_to_send())
        while True:
            data = s.recv(65536)
            if not data:
                return None
            for event in conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    status = dict(event.headers or ()).get(b"grpc-status")
                    if status is not None:
                        return int(status)
                if isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                    return None
            s.sendall(conn.data_to_send())


ROUTER_RPC = "/radixmesh.v1.Router/GetModelInfo"
WORKER_RPC = "/radixmesh.v1.Worker/GetModelInfo"


def junk_call(c: Cluster, kind: str) -> str:
    """One call of `kind` (the module's doc); its answer as a short string."""
    try:
        return _junk_call(c, kind)
    except OSError as e:  # refused, reset, timed out: an answer too
        return type(e).__name__


def _junk_call(c: Cluster, kind: str) -> str:
    basic = [(b"authorization", b"Basic " + JUNK + b"\xff")]
    if kind == "grpc-router":
        return f"grpc {grpc_raw(c.grpc_port, ROUTER_RPC, basic)}"
    if kind == "grpc-worker":
        return f"grpc {grpc_raw(c.worker_port, WORKER_RPC, basic)}"
    if kind == "http-malformed":
        headers = b"Authorization: Basic " + JUNK + b"\x0b"
        return f"http {http_raw(c.http_port, http_request('GET', '/v1/models', headers))}"
    if kind == "http-wrong":
        headers = b"Authorization: Bearer " + JUNK
        return f"http {http_raw(c.http_port, http_request('GET', '/v1/models', headers))}"
    raise ValueError(f"kind: unknown {kind!r}")


def flood(c: Cluster, calls: int, rate: float = 0.0) -> Counter[str]:
    """`calls` junk calls, the kinds in turn, `rate` a second (0: one after another): how
    each kind was answered."""
    answers: Counter[str] = Counter()
    start = time.monotonic()
    for i in range(calls):
        if rate > 0:
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
        kind = KINDS[i % len(KINDS)]
        answers[f"{kind}: {junk_call(c, kind)}"] += 1
    return answers


# ---- the benchmark ------------------------------------------------------------------------


def run(calls: int, rate: float = 0.0, source: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, cluster(Path(tmp), source=source) as c:
        before = c.sizes()
        lines_before = {n: len(p.read_bytes().splitlines()) for n, p in c.logs.items()}
        start = time.monotonic()
        answers = flood(c, calls, rate)
        seconds = time.monotonic() - start
        c.stop()
        after = c.sizes()
        lines_after = {n: len(p.read_bytes().splitlines()) for n, p in c.logs.items()}
    growth = {n: after[n] - before[n] for n in before}
    return {
        "calls": calls,
        "rate": rate,
        "junk_bytes": len(JUNK),
        "seconds": round(seconds, 2),
        "answers": dict(sorted(answers.items())),
        "log_bytes_added": growth,
        "log_lines_added": {n: lines_after[n] - lines_before[n] for n in before},
        "log_bytes_added_total": sum(growth.values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=0.0, help="calls a second (0: back to back)")
    ap.add_argument("--source", default=None, help="run the cluster from this source tree")
    record.add_output_arguments(ap)
    args = ap.parse_args()
    figures = run(args.calls, args.rate, args.source)
    print(f"{args.calls} junk calls in {figures['seconds']} s")
    print(f"{'process':<8} {'bytes added':>12} {'lines added':>12}")
    added, lines = figures["log_bytes_added"], figures["log_lines_added"]
    for name in added:
        print(f"{name:<8} {added[name]:>12,} {lines[name]:>12,}")
    print(f"{'total':<8} {figures['log_bytes_added_total']:>12,}")
    for answer, count in figures["answers"].items():
        print(f"  {count:>6}  {answer}")
    record.write("log_flood", args, figures)


if __name__ == "__main__":
    main()
