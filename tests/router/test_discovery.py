"""Workers found through DNS, reached over mutual TLS: two real dummy:tiny workers on one
port of two loopback addresses (127.0.0.1 and 127.0.0.2, as two pods behind a headless
Service), each requiring a client certificate. A stand-in for the DNS answers lets the test
scale the set up and down; the real look-up (getaddrinfo) is checked on `localhost`, and a
router process started with `--workers dns:localhost:PORT` serves through it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from radixmesh.client import Client
from radixmesh.cluster.launch import free_port
from radixmesh.router.config import RouterConfig
from radixmesh.router.discovery import DnsDiscovery, dns_names, resolve_addresses
from radixmesh.router.pool import WorkerPool
from tests.tls import self_signed

pytestmark = pytest.mark.slow

HOSTS = ("127.0.0.1", "127.0.0.2")


class Certs:
    def __init__(self, root: Path) -> None:
        (root / "server").mkdir()
        (root / "client").mkdir()
        self.server_cert, self.server_key = self_signed(root / "server")
        self.client_cert, self.client_key = self_signed(root / "client")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Certs]]:
    certs = Certs(tmp_path_factory.mktemp("tls"))
    port = free_port()
    procs = [
        subprocess.Popen([
            sys.executable, "-m", "radixmesh.cluster.cli", "worker", "--model", "dummy:tiny",
            "--dtype", "float32", "--host", host, "--port", str(port),
            "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
            "--tls-client-ca", str(certs.client_cert),
        ])
        for host in HOSTS
    ]  # fmt: skip
    try:
        yield port, certs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def _config(port: int, certs: Certs, client_cert: bool = True) -> RouterConfig:
    return RouterConfig(
        workers=(f"dns:workers.test:{port}",),
        worker_tls_ca=str(certs.server_cert),
        worker_tls_cert=str(certs.client_cert) if client_cert else None,
        worker_tls_key=str(certs.client_key) if client_cert else None,
        worker_tls_server_name="localhost",  # the certificate names localhost, not .2
    )


async def _healthy(pool: WorkerPool, timeout: float = 60.0) -> dict[str, bool]:
    deadline = time.monotonic() + timeout
    while True:
        health = {wid: await w.poll() for wid, w in sorted(pool.workers.items())}
        if all(health.values()) or time.monotonic() > deadline:
            return health
        await asyncio.sleep(0.3)


def test_dns_discovery_scales_the_pool_over_mutual_tls(workers: tuple[int, Certs]) -> None:
    port, certs = workers
    a, b = (f"{h}:{port}" for h in HOSTS)
    answers: list[set[str] | OSError] = [{a}, {a, b}, OSError("SERVFAIL"), {b}]

    async def lookup(host: str, p: int) -> set[str]:
        assert (host, p) == ("workers.test", port)
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    async def main() -> list[object]:
        config = _config(port, certs)
        pool = WorkerPool(config)
        assert pool.workers == {} and dns_names(config) == [("workers.test", port)]
        discovery = DnsDiscovery(pool, dns_names(config), 5.0, lookup)
        seen: list[object] = []
        try:
            for _ in range(4):
                await discovery.refresh()
                seen.append(await _healthy(pool))
            await asyncio.sleep(0.1)
            seen.append([h.worker_id for h in discovery.retiring])
            # The workers require a client certificate: without one, no answer.
            bare = WorkerPool(_config(port, certs, client_cert=False))
            handle = bare.add_worker(a, a)
            seen.append(await handle.poll())
            await bare.close()
        finally:
            await discovery.close()
            await pool.close()
        return seen

    assert asyncio.run(main()) == [
        {a: True},
        {a: True, b: True},
        {a: True, b: True},  # a failed look-up keeps the last answer
        {b: True},
        [],  # a's handle closed: no request was on it
        False,
    ]


def test_the_real_lookup_and_a_router_on_dns_workers(workers: tuple[int, Certs]) -> None:
    port, certs = workers
    assert f"127.0.0.1:{port}" in asyncio.run(resolve_addresses("localhost", port))
    router_port = free_port()
    router = subprocess.Popen([
        sys.executable, "-m", "radixmesh.cluster.cli", "router", "--host", "127.0.0.1",
        "--port", str(router_port), "--workers", f"dns:localhost:{port}",
        "--discovery-interval", "0.5", "--worker-tls-ca", str(certs.server_cert),
        "--worker-tls-cert", str(certs.client_cert),
        "--worker-tls-key", str(certs.client_key),
    ])  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        with Client(f"127.0.0.1:{router_port}", timeout=30) as client:
            while not client.health():
                assert router.poll() is None and time.monotonic() < deadline
                time.sleep(0.3)
            out = client.generate("hello", {"max_new_tokens": 3, "ignore_eos": True})
        assert out.completion_tokens == 3
    finally:
        router.terminate()
        assert router.wait(timeout=30) == 0
