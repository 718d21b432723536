"""Workers found through DNS: each `dns:name:port` entry of `RouterConfig.workers` stands
for every address `name` resolves to (a Kubernetes headless Service lists one address per
worker pod), looked up again every `discovery_interval` seconds.

A new address joins the pool as a worker (its id is its address); an address that is gone
leaves it: no new request goes there, and its handle is closed once the router's requests
on it have ended (a pod being deleted drains them). A failed look-up keeps the workers
the last one found, so a DNS hiccup never empties the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable

from radixmesh.router.config import DNS_PREFIX, RouterConfig
from radixmesh.router.pool import WorkerHandle, WorkerPool

logger = logging.getLogger(__name__)

RETIRE_TIMEOUT = 600.0  # seconds a removed worker's requests may take to end

# host, port -> the addresses (host:port) it resolves to now.
Lookup = Callable[[str, int], Awaitable[set[str]]]


async def resolve_addresses(host: str, port: int) -> set[str]:
    """Every address `host` resolves to (A and AAAA), as host:port."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out = set()
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        out.add(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
    return out


def dns_names(config: RouterConfig) -> list[tuple[str, int]]:
    """The (name, port) of each `dns:name:port` worker entry."""
    names = []
    for entry in config.workers:
        if entry.startswith(DNS_PREFIX):
            host, _, port = entry[len(DNS_PREFIX) :].rpartition(":")
            names.append((host, int(port)))
    return names


class DnsDiscovery:
    def __init__(
        self,
        pool: WorkerPool,
        names: list[tuple[str, int]],
        interval: float,
        lookup: Lookup = resolve_addresses,
    ) -> None:
        self.pool = pool
        self.names = names
        self.interval = interval
        self.lookup = lookup
        self.found: dict[tuple[str, int], set[str]] = {n: set() for n in names}
        self._task: asyncio.Task[None] | None = None
        self._retiring: dict[WorkerHandle, asyncio.Task[None]] = {}

    async def refresh(self) -> None:
        """Look every name up once and bring the pool's membership in line."""
        for name in self.names:
            try:
                now = await self.lookup(*name)
            except OSError as e:
                logger.warning("looking up workers at %s:%d failed: %s", *name, e)
                continue
            before = self.found[name]
            for address in sorted(now - before):
                logger.info("worker %s appeared (%s)", address, name[0])
                self.pool.add_worker(address, address)
            for address in sorted(before - now):
                logger.info("worker %s is gone (%s)", address, name[0])
                self._retire(self.pool.remove_worker(address))
            self.found[name] = now

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.refresh()

    def _retire(self, handle: WorkerHandle) -> None:
        async def close_when_idle() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + RETIRE_TIMEOUT
            while handle.in_flight > 0 and loop.time() < deadline:
                await asyncio.sleep(0.5)
            await handle.close()
            self._retiring.pop(handle, None)

        self._retiring[handle] = asyncio.create_task(close_when_idle())

    @property
    def retiring(self) -> list[WorkerHandle]:
        """Removed workers whose handles are not closed yet."""
        return list(self._retiring)

    async def close(self) -> None:
        """Stop looking up; close the removed workers' handles now (the pool closes the
        others)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for handle, task in list(self._retiring.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await handle.close()
        self._retiring.clear()
