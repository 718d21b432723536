"""No client key in any process's log, and junk calls add little to it: a catalogue of
malformed headers, metadata and field names against a local cluster.

A worker (dummy:tiny) and a router, each a process with its log in a file (the worker's
engine process writes to the worker's), with two client keys, an admin key and the
workers' key (bench/log_flood.py starts them). The router runs with
`--no-strict-openai`, so that an unknown field's name is logged rather than refused. Every
case carries a real key (or a piece of one) in the wrong place:

- HTTP/1.1 to the router (and HTTP/2 with a key, which it does not speak): a key in a
  header aiohttp cannot parse (control characters, a bare CR, 9 KB, no colon), as Basic
  credentials, under another header's name; a wrong or cut key, well-formed; a key's
  prefix or a whole key as a JSON field's name, at the top level and inside
  `sampling_params`, on every generation API;
- raw HTTP/2 (gRPC) to the router and to the worker: a key in metadata that is not UTF-8
  (`\\xff`) or holds control characters, as Basic credentials, bare, under another
  metadata name, as a metadata name; the worker does not know the client keys, so only
  masking without knowing them keeps those out of its log.

Then 300 junk-authorization calls (4 KB values, bench/log_flood.py's four kinds), each
log's growth measured. The processes are stopped before their logs are read
(log_limit.py writes its counts at exit).
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import h2.config
import h2.connection
import pytest

from bench.log_flood import (
    ROUTER_RPC,
    WORKER_RPC,
    Cluster,
    Keys,
    cluster,
    flood,
    grpc_raw,
    http_request,
)
from bench.log_flood import http_raw as http_status
from radixmesh.redact import MASK

pytestmark = pytest.mark.slow  # a cluster of two processes, ~35 s

KEYS = Keys()
CLIENT = KEYS.clients[0]
PIECE = 8  # no piece of a key this long may be in a log
UNAUTHENTICATED, INTERNAL = 16, 13


def _metadata(key: str) -> dict[str, list[tuple[bytes, bytes]]]:
    k = key.encode()
    return {
        "bearer \\xff": [(b"authorization", b"Bearer " + k + b"\xff")],
        "basic \\xff": [(b"authorization", b"Basic " + base64.b64encode(k + b":") + b"\xff")],
        "basic raw \\xff": [(b"authorization", b"Basic " + k + b"\xff")],
        "bare \\xff": [(b"authorization", k + b"\xff")],
        "bearer NUL": [(b"authorization", b"Bearer " + k + b"\x00")],
        "bearer VT": [(b"authorization", b"Bearer " + k + b"\x0b")],
        "bearer CR": [(b"authorization", b"Bearer " + k + b"\r")],
        "x-api-key \\xff": [(b"x-api-key", k + b"\xff")],
        "other name \\xff": [(b"x-trace", k + b"\xff")],
        "key as a name": [(k.lower(), b"1")],
        "key as a bad name": [(k, b"1")],  # capitals: not a metadata name
        "over 16 KB": [(b"authorization", b"Bearer " + k + b"A" * 20000)],
    }


_AUTH = f"Authorization: Bearer {CLIENT}".encode()
_HEADERS = {  # name -> (header lines, the status)
    "VT": (_AUTH + b"\x0b", 400),
    "NUL": (_AUTH + b"\x00", 400),
    "bare CR": (_AUTH + b"\rX-Other: 1", 400),
    "over 8 KB": (_AUTH + b"A" * 9000, 400),
    "no colon": (f"Authorization Bearer {CLIENT}".encode(), 400),
    "basic VT": (b"Authorization: Basic " + base64.b64encode(CLIENT.encode()) + b"\x0b", 400),
    "basic raw VT": (f"Authorization: Basic {CLIENT}".encode() + b"\x0b", 400),
    "key as a name": (f"{CLIENT}: 1".encode() + b"\x0b", 400),
    "x-api-key NUL": (f"X-Api-Key: {CLIENT}".encode() + b"\x00", 400),
    "basic, well-formed": (b"Authorization: Basic " + base64.b64encode(CLIENT.encode()), 401),
    "cut key": (f"Authorization: Bearer {CLIENT[:-1]}".encode(), 401),
    "no scheme": (f"Authorization: {CLIENT}".encode(), 401),
}
_MESSAGES = [{"role": "user", "content": "hi"}]
_BODIES: dict[
    str, dict[str, Any]
] = {  # path -> a body to add a field to (one token at most, greedy)
    "/v1/completions": {"model": "dummy:tiny", "prompt": "hi", "max_tokens": 1},
    "/v1/chat/completions": {"model": "dummy:tiny", "messages": _MESSAGES, "max_tokens": 1},
    "/v1/messages": {"model": "dummy:tiny", "max_tokens": 1, "messages": _MESSAGES},
    "/v1/responses": {"model": "dummy:tiny", "input": "hi", "max_output_tokens": 1},
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 1}},
}
# A key's prefix, a longer piece, a whole key: each a field's name.
_NAMES = (CLIENT[:PIECE], CLIENT[:12], CLIENT, KEYS.admin[:10], KEYS.worker)


@dataclass
class Probed:
    grpc: dict[str, int | None]
    http: dict[str, int]
    fields: dict[str, int | None]
    replies: list[bytes]  # the bodies of the 400s for malformed heads
    logs: dict[str, str]
    junk_bytes: dict[str, int]  # each log's growth over the junk calls


def _reply(c: Cluster, request: bytes) -> bytes:
    """`request` on a new connection: the whole reply (the connection is closed after)."""
    with socket.create_connection(("127.0.0.1", c.http_port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while more := s.recv(65536):
            data += more
    return data


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probed]:
    directory = tmp_path_factory.mktemp("cluster")
    with cluster(directory, router_args=("--no-strict-openai",)) as c:
        grpc: dict[str, int | None] = {}
        for name, md in _metadata(CLIENT).items():
            grpc[f"router {name}"] = grpc_raw(c.grpc_port, ROUTER_RPC, md)
        for who, key in (("client", CLIENT), ("worker", KEYS.worker)):
            for name, md in _metadata(key).items():
                grpc[f"worker, {who} key, {name}"] = grpc_raw(c.worker_port, WORKER_RPC, md)
        http: dict[str, int] = {}
        replies: list[bytes] = []
        for name, (headers, _) in _HEADERS.items():
            reply = _reply(c, http_request("GET", "/v1/models", headers))
            http[name] = int(reply.split(b" ", 2)[1])
            replies.append(reply)
        reply = _reply(c, _h2_to_http_port())  # HTTP/2 where HTTP/1.1 is served
        http["HTTP/2 prior knowledge"] = int(reply.split(b" ", 2)[1])
        replies.append(reply)
        fields: dict[str, int | None] = {}
        auth = f"Authorization: Bearer {KEYS.clients[1]}".encode()
        for path, body in _BODIES.items():
            for i, name in enumerate(_NAMES):
                sent = json.dumps({**body, name: 1}).encode()
                fields[f"{path} {i}"] = http_status(
                    c.http_port, http_request("POST", path, auth, sent)
                )
            inner = {**body, "sampling_params": {CLIENT[:9]: 1, "max_new_tokens": 1}}
            sent = json.dumps(inner).encode()
            fields[f"{path} sampling"] = http_status(
                c.http_port, http_request("POST", path, auth, sent)
            )
        # After the cases: the ports' gates (which close connections that never
        # authenticate, many from one address) may refuse some of these, not the cases.
        before = c.sizes()
        flood(c, 300)
        grown = {name: size - before[name] for name, size in c.sizes().items()}
        c.stop()
        logs = {name: path.read_text(errors="replace") for name, path in c.logs.items()}
    yield Probed(grpc, http, fields, replies, logs, grown)


def _h2_to_http_port() -> bytes:
    """An HTTP/2 connection's first bytes (preface, SETTINGS, a HEADERS frame with a key)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    headers = [(":method", "GET"), (":scheme", "http"), (":authority", "127.0.0.1")]
    headers += [(":path", "/v1/models"), ("authorization", f"Bearer {CLIENT}")]
    conn.send_headers(1, headers, end_stream=True)
    return conn.data_to_send()


def _pieces(secret: str) -> set[str]:
    return {secret[i : i + PIECE] for i in range(len(secret) - PIECE + 1)}


def test_no_piece_of_any_key_in_any_log(probed: Probed) -> None:
    assert "radixmesh router on port" in probed.logs["router"]  # the logs are written
    assert "radixmesh worker listening" in probed.logs["worker"]
    pieces = set().union(*(_pieces(k) for k in KEYS.all))
    for name, log in probed.logs.items():
        found = sorted(p for p in pieces if p in log or p.lower() in log)
        assert found == [], (name, found)
    # The unknown fields were logged (once per name), masked: the router knows its keys.
    marker = "ignoring the unknown request field '"
    logged = {
        line.split(marker, 1)[1].split("'", 1)[0]
        for line in probed.logs["router"].splitlines()
        if marker in line
    }
    assert logged == {MASK, "sampling_params"}  # (OpenAI's routes do not take SGLang's)


def test_every_case_is_refused(probed: Probed) -> None:
    want_grpc = {name: UNAUTHENTICATED for name in probed.grpc}
    for name in want_grpc:
        if name.endswith("key as a bad name"):
            want_grpc[name] = INTERNAL  # grpc-core's for a metadata name it cannot take
    assert probed.grpc == want_grpc
    want_http = {name: status for name, (_, status) in _HEADERS.items()}
    assert probed.http == {**want_http, "HTTP/2 prior knowledge": 400}
    # Not strict: OpenAI's and Anthropic's APIs ignore the unknown field (and serve);
    # SGLang's native API refuses it, as SGLang does.
    want = {k: 400 if k.startswith("/generate") else 200 for k in probed.fields}
    assert probed.fields == want


def test_error_replies_quote_no_header(probed: Probed) -> None:
    for reply in probed.replies:
        head, body = reply.split(b"\r\n\r\n", 1)
        assert not any(p.encode() in reply for p in _pieces(CLIENT)), reply[:300]
        if head.startswith(b"HTTP/1.1 400"):
            error = json.loads(body)["error"]
            assert error["code"] == "bad_request", error
            assert error["message"].startswith("the request could not be parsed ("), error


def test_junk_calls_add_little_to_the_logs(probed: Probed) -> None:
    # 300 calls with a 4 KB junk authorization value (75 of each kind): before the limit,
    # one ERROR with a traceback (2.3 KB) per gRPC call, 344 KB in all.
    total = sum(probed.junk_bytes.values())
    print(f"300 junk calls added {total:,} bytes of log: {probed.junk_bytes}")
    assert total < 15_000, probed.junk_bytes
    for log in probed.logs.values():
        assert "more lines like this one" in log  # what was not logged is counted
