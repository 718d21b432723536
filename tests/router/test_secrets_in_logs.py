"""No key in the router's log: malformed headers and metadata carrying a real key, sent raw.

A `radixmesh router` process with API, admin and worker keys, its stdout and stderr in a
file, in front of a worker address nobody listens on: every case here is refused before
a worker would be asked (aiohttp's parser, gRPC's metadata decoding, the key check), so
none is needed. The requests go over raw sockets (HTTP/1.1) and raw HTTP/2 frames (h2),
since the clients refuse to send such bytes. The process is stopped before its log is
read, so everything it wrote is there.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.log_flood import grpc_raw
from radixmesh.cluster.env import ADMIN_KEY_ENV, API_KEY_ENV, WORKER_API_KEY_ENV
from radixmesh.cluster.launch import free_port

KEY = "key-alpha-7d2c"  # a valid API key: each case sends it whole
OTHER = "key-beta-91fe"
ADMIN = "admin-key-c0de"
WORKER = "worker-key-5e11"

_AUTH = f"Authorization: Bearer {KEY}".encode()
HTTP_CASES = {  # name -> (request line, header lines)
    "vertical tab": (b"GET /v1/models HTTP/1.1", _AUTH + b"\x0b"),
    "NUL": (b"GET /v1/models HTTP/1.1", _AUTH + b"\x00"),
    "DEL": (b"GET /v1/models HTTP/1.1", _AUTH + b"\x7f"),
    "bare CR": (b"GET /v1/models HTTP/1.1", _AUTH + b"\rX-Other: 1"),
    "LF only": (b"GET /v1/models HTTP/1.1", _AUTH + b"\nX-Other: 1"),
    "over 8 KB": (b"GET /v1/models HTTP/1.1", _AUTH + b"A" * 9000),
    "no colon": (b"GET /v1/models HTTP/1.1", f"Authorization Bearer {KEY}".encode()),
    "folded": (b"GET /v1/models HTTP/1.1", b"X-A: 1\r\n " + _AUTH),
    "x-api-key NUL": (b"GET /v1/models HTTP/1.1", f"X-Api-Key: {KEY}".encode() + b"\x00"),
    "request line": (f"GET /v1/models?key={KEY}".encode() + b"\x0b HTTP/1.1", b"X-A: 1"),
}
_BEARER = f"Bearer {KEY}".encode()
GRPC_CASES = {  # name -> metadata (raw bytes; every one reaches the server as sent)
    "\\xff": [(b"authorization", _BEARER + b"\xff")],
    "NUL": [(b"authorization", _BEARER + b"\x00")],
    "DEL": [(b"authorization", _BEARER + b"\x7f")],
    "vertical tab": [(b"authorization", _BEARER + b"\x0b")],
    "bare CR": [(b"authorization", _BEARER + b"\r")],
    "over 16 KB": [(b"authorization", _BEARER + b"A" * 20000)],
    "another header": [(b"authorization", b"Bearer wrong"), (b"x-api-key", KEY.encode() + b"\xff")],
}


@dataclass
class Probed:
    http: dict[str, bytes]  # case -> the response's status line
    grpc: dict[str, int | None]  # case -> grpc-status (None: no status came)
    log: str


def _http(port: int, line: bytes, headers: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(line + b"\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n\r\n")
        data = b""
        while b"\r\n" not in data:
            more = s.recv(65536)
            if not more:
                break
            data += more
    return data.split(b"\r\n", 1)[0]


RPC = "/radixmesh.v1.Router/GetModelInfo"  # one call with each case's metadata as is


def _wait_listening(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, "the router exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the router did not listen"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probed]:
    log_path = tmp_path_factory.mktemp("router") / "router.log"
    grpc_port, http_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "radixmesh.cluster.cli", "router", "--host", "127.0.0.1"]
    cmd += ["--workers", f"127.0.0.1:{free_port()}", "--port", str(grpc_port)]
    cmd += ["--http-port", str(http_port)]
    env = {**os.environ, API_KEY_ENV: f"{KEY},{OTHER}", ADMIN_KEY_ENV: ADMIN}
    env[WORKER_API_KEY_ENV] = WORKER
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_listening(proc, http_port)
        _wait_listening(proc, grpc_port)
        http = {name: _http(http_port, *case) for name, case in HTTP_CASES.items()}
        grpc = {name: grpc_raw(grpc_port, RPC, md) for name, md in GRPC_CASES.items()}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    yield Probed(http, grpc, Path(log_path).read_text(errors="replace"))


def test_malformed_headers_get_400_and_one_line_without_the_key(probed: Probed) -> None:
    for name, status_line in probed.http.items():
        assert status_line.split(b" ")[1] == b"400", (name, status_line)
    # Counted into the port's summary line (listener.py), never a line or a traceback
    # per request: the client's error, and a flood of them must not flood the log.
    summary = [line for line in probed.log.splitlines() if "malformed requests (400)" in line]
    assert summary, probed.log
    counted = sum(int(line.split("malformed requests (400)")[0].split()[-1]) for line in summary)
    assert counted == len(HTTP_CASES), probed.log
    assert "aiohttp.http_exceptions" not in probed.log  # no traceback


def test_bad_metadata_is_denied(probed: Probed) -> None:
    unauthenticated = 16
    assert probed.grpc == dict.fromkeys(GRPC_CASES, unauthenticated)


def test_no_key_in_the_log(probed: Probed) -> None:
    assert "radixmesh router on port" in probed.log  # the log is the router's, and written
    for secret in (KEY, OTHER, ADMIN, WORKER):
        assert secret not in probed.log
    # Not even a long enough part of one (a cut inside a key would leave its start).
    assert "key-alpha-7" not in probed.log
