"""A worker's life: NOT_SERVING while the model loads, TLS, a drain that runs out of time,
and a port it cannot have.

A second worker process (TLS with a self-signed certificate, a 1-second drain timeout):
a request still running when the drain timeout passes is aborted cleanly (its stream
ends with finish_reason "abort") and the process exits 0.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from radixmesh.client import Client
from radixmesh.cluster.env import API_KEY_ENV
from tests.tls import self_signed

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health_statuses_until_serving(target: str, creds: grpc.ChannelCredentials) -> list[str]:
    """Every distinct health answer (or transport failure) until SERVING, in order."""
    seen: list[str] = []
    deadline = time.monotonic() + 180
    with grpc.secure_channel(target, creds) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while not seen or seen[-1] != "SERVING":
            assert time.monotonic() < deadline, seen
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.RpcError as e:
                status = e.code().name
            if not seen or seen[-1] != status:
                seen.append(status)
            time.sleep(0.02)
    return seen


def test_loading_tls_and_drain_timeout(tmp_path: Path, smollm2_gguf: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = _free_port()
    cmd = [sys.executable, "-m", "radixmesh.cluster.cli", "worker", "--model", "smollm2"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--drain-timeout", "1"]
    cmd += ["--tls-cert", str(cert), "--tls-key", str(key), "--kv-cache-tokens", "2048"]
    log = tmp_path / "worker.log"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        seen = _health_statuses_until_serving(f"localhost:{port}", creds)
        # Listening before the model is loaded: NOT_SERVING first, then SERVING.
        assert seen[-2:] == ["NOT_SERVING", "SERVING"], (seen, log.read_text())

        client = Client(f"localhost:{port}", root_certificates=cert.read_bytes(), timeout=60)
        params = {"temperature": 0.0, "max_new_tokens": 1000, "ignore_eos": True}
        stream = client.generate("Count to a thousand:", params, stream=True)
        first = next(stream)
        assert first.finish_reason is None
        proc.send_signal(signal.SIGTERM)
        chunks = [first, *stream]  # outlives the 1 s drain: aborted cleanly
        assert chunks[-1].finish_reason == "abort"
        assert chunks[-1].finish_message == "the worker is shutting down"
        assert 1 < chunks[-1].completion_tokens < 1000
        client.close()
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert "drain timeout: aborting 1 requests" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_a_port_another_server_holds_stops_the_worker_with_one_line() -> None:
    """The other server shares its port (SO_REUSEPORT, as grpc-core and router replicas
    do); a worker still gets no share of it, with a key (the gate) or without."""
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for key in ("", "worker-key"):
            cmd = [sys.executable, "-m", "radixmesh.cluster.cli", "worker", "--model"]
            cmd += ["dummy:tiny", "--host", "127.0.0.1", "--port", str(port)]
            env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
            env |= {API_KEY_ENV: key} if key else {}
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 1, done.stderr
            last = done.stderr.strip().splitlines()[-1]
            assert last.startswith(f"radixmesh worker: cannot listen on 127.0.0.1:{port}: ")
            assert "Traceback" not in done.stderr
