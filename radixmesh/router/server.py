"""The router process: the Router service, health and reflection on one port; the
HTTP API, OpenAI's and SGLang's (`http_port`) and Prometheus metrics (`metrics_port`) beside it.

It starts listening at once (health NOT_SERVING, HTTP 503), waits for a worker to answer,
loads the tokenizer that worker names, then turns SERVING. SIGTERM / SIGINT drain it:
NOT_SERVING, the gRPC port closed to new calls (clients fail over to another router), new
HTTP requests 503, those in flight get `drain_timeout` seconds, then the rest end with
UNAVAILABLE (an SSE stream: an error event, then [DONE]).
API keys (`api_keys`; `admin_keys` for FlushCache, ClusterStatus and aborting any request:
auth.Roles) and TLS (`tls_cert` / `tls_key`) apply to the gRPC and HTTP ports. Every log
line is redacted (redact.py): no key, the router's own or a client's, is ever written out.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import grpc

from radixmesh import log_limit, redact
from radixmesh.auth import ApiKeyInterceptor
from radixmesh.gate import Gate, KeylessCollector
from radixmesh.grpc_server import (
    PENDING_CALL_OPTIONS,
    DecodeGuard,
    add_health_and_reflection,
    bind,
    set_health,
)
from radixmesh.keepalive import KEEPALIVE
from radixmesh.listener import (
    GATED_DESCRIPTORS,
    Tally,
    connection_cap,
    grpc_options,
    raise_descriptor_limit,
)
from radixmesh.router.config import RouterConfig
from radixmesh.router.control import ControlPlane
from radixmesh.router.discovery import DnsDiscovery, dns_names
from radixmesh.router.dispatch import Dispatcher
from radixmesh.router.metrics import RouterMetrics
from radixmesh.router.pool import WorkerPool
from radixmesh.router.service import RouterServicer
from radixmesh.v1 import router_pb2, router_pb2_grpc

logger = logging.getLogger(__name__)

_SERVER_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    *KEEPALIVE.server_options(),  # what the SDK's and the routers' channels keep to
    *PENDING_CALL_OPTIONS,
]
SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name


async def serve(
    config: RouterConfig,
    ready: asyncio.Event | None = None,
    *,
    pool: WorkerPool | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Serve until SIGTERM / SIGINT, or until `stop` is set when the caller owns it (off
    the main thread, e.g. in a Ray actor, where signal handlers cannot be installed).
    `pool`: the caller's (e.g. with address resolvers); default one from `config`."""
    redact.install(secrets_of(config))  # before anything can log a request
    if config.api_keys and not config.admin_keys:
        logger.info(
            "no admin key: every API key may see the workers and flush their caches "
            "(--admin-key keeps that to its holders); no key reaches another's requests"
        )
    pool = pool if pool is not None else WorkerPool(config)
    discovery = None
    if names := dns_names(config):
        discovery = DnsDiscovery(pool, names, config.discovery_interval)
        await discovery.refresh()
        discovery.start()
    metrics = RouterMetrics(pool)
    cap = _connection_cap(config)
    options = _SERVER_OPTIONS + grpc_options(config.listener_limits, cap)
    gate = _gate(config, cap)
    keyless = KeylessCollector({} if gate is None else {"grpc": gate})
    metrics.registry.register(keyless)
    server = grpc.aio.server(options=options, interceptors=_interceptors(config, metrics, gate))
    control = ControlPlane(config, pool, metrics)
    dispatch = Dispatcher(config, control, metrics)
    router_pb2_grpc.add_RouterServicer_to_server(RouterServicer(control, dispatch), server)
    health_servicer = add_health_and_reflection(server, SERVICE_NAME)
    await set_health(health_servicer, SERVICE_NAME, serving=False)
    metrics_server = None
    if config.metrics_port is not None:
        metrics_server = metrics.serve(config.metrics_port, config.host)
    stop = stop if stop is not None else _stop_on_signals()
    ports = _Ports(config, server, control, dispatch, http_cap=cap, gate=gate, keyless=keyless)
    if not config.listen_when_serving:
        await ports.open()
    logger.info("radixmesh router on port %d; waiting for workers", ports.port)
    if await _start_serving(control, health_servicer, stop):
        await ports.open()
        _say_serving(control, ports.port)
        if ready is not None:
            ready.set()
        await stop.wait()
    http = ports.http
    await set_health(health_servicer, SERVICE_NAME, serving=False)
    # New gRPC calls go elsewhere at once (GOAWAY on every connection, the port closed: a
    # client given several routers fails over); the calls in flight run on meanwhile.
    grace = config.drain_timeout + STOPPED_STREAMS_GRACE + 1.0
    grpc_stopped = asyncio.create_task(server.stop(grace=grace)) if ports.opened else None
    if gate is not None:
        await gate.close()  # the public port closed; authenticated connections run on
    await drain(dispatch, config.drain_timeout)
    if http is not None:
        await http.stop()
    if grpc_stopped is not None:
        await grpc_stopped
    if metrics_server is not None:
        metrics_server.shutdown()
    if discovery is not None:
        await discovery.close()
    await pool.close()
    return 0


def secrets_of(config: RouterConfig) -> tuple[str, ...]:
    """The keys the router's log lines must never show (redact.py)."""
    worker_key = (config.worker_api_key,) if config.worker_api_key else ()
    return (*config.api_keys, *config.admin_keys, *worker_key)


# Seconds the streams stopped at the end of a drain get to send their error (an SSE error
# event and [DONE], a gRPC status) before the servers close their connections.
STOPPED_STREAMS_GRACE = 2.0


async def drain(dispatch: Dispatcher, timeout: float) -> None:
    """New requests get UNAVAILABLE (503); those in flight get `timeout` seconds to
    finish; the rest are stopped with an error their clients see (not a cut stream)."""
    dispatch.admission.close("the router is shutting down: it takes no new requests")
    logger.info("draining: %d requests in flight", dispatch.admission.active)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while dispatch.admission.active and loop.time() < deadline:
        await asyncio.sleep(0.05)
    if dispatch.admission.active:
        logger.info("drain timeout: stopping %d requests", dispatch.admission.active)
        dispatch.stop_streams("the router shut down before the request finished")
        deadline = loop.time() + STOPPED_STREAMS_GRACE
        while dispatch.admission.active and loop.time() < deadline:
            await asyncio.sleep(0.05)


def _connection_cap(config: RouterConfig) -> int:
    """Connections the gRPC and the HTTP port may each hold (radixmesh/listener.py), after
    raising the descriptor limit as far as it goes."""
    descriptors = raise_descriptor_limit()
    limits = config.listener_limits
    listeners = 1 if config.http_port is None else 2
    cap = connection_cap(limits, listeners, descriptors)
    logger.info(
        "descriptor limit %d: up to %d connections per port (%s)",
        descriptors,
        cap,
        "--max-connections" if limits.max_connections else "the limit's share",
    )
    if cap * listeners > descriptors:
        logger.warning(
            "--max-connections %d x %d ports is over the descriptor limit %d: accept() "
            "will fail before the cap refuses connections",
            cap,
            listeners,
            descriptors,
        )
    return cap


def _gate(config: RouterConfig, cap: int) -> Gate | None:
    """The gRPC port's gate (gate.py) where callers need a key: it closes the connections
    that do not authenticate. A gated connection holds GATED_DESCRIPTORS descriptors."""
    if not config.caller_keys:
        return None
    tls = bool(config.tls_cert and config.tls_key)
    limits = config.listener_limits
    return Gate(limits, max(1, cap // GATED_DESCRIPTORS), Tally("gRPC port"), tls=tls)


def _interceptors(config: RouterConfig, metrics: RouterMetrics, gate: Gate | None) -> list[Any]:
    """Undecodable messages become INVALID_ARGUMENT; callers' keys (with the admin keys),
    each call's outcome told to the gate."""
    interceptors: list[Any] = [DecodeGuard()]
    if not config.caller_keys:
        return interceptors
    denied = metrics.requests.labels  # count denied RPCs like the ones that ran

    def on_deny(method: str) -> None:
        denied("grpc", method.rsplit("/", 1)[-1], "UNAUTHENTICATED").inc()

    on_outcome = None if gate is None else gate.report
    interceptors.append(ApiKeyInterceptor(config.caller_keys, on_deny, on_outcome))
    return interceptors


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


class _Ports:
    """The router's listeners: the gRPC port, and the HTTP API's when configured; opened
    once (at start, or only once serving: `listen_when_serving`)."""

    def __init__(
        self,
        config: RouterConfig,
        server: grpc.aio.Server,
        control: ControlPlane,
        dispatch: Dispatcher,
        http_cap: int,
        gate: Gate | None = None,
        keyless: KeylessCollector | None = None,
    ) -> None:
        self.config = config
        self.gate = gate
        self.keyless = keyless
        self.http_cap = http_cap
        self.server = server
        self.control = control
        self.dispatch = dispatch
        self.port = config.port
        self.http: Any = None
        self.opened = False

    async def open(self) -> None:
        if self.opened:
            return
        self.opened = True
        c = self.config
        if self.gate is None:
            address = f"{c.host}:{c.port}"
            self.port = bind(self.server, address, c.tls_cert, c.tls_key, c.tls_client_ca)
            await self.server.start()
        else:  # grpc-core on loopback, the gate on the public address
            inner = bind(self.server, "127.0.0.1:0", c.tls_cert, c.tls_key, c.tls_client_ca)
            await self.server.start()
            self.port = await self.gate.start(c.host, c.port, inner)
            self.gate.tally.name = f"gRPC port {self.port}"
        if c.http_port is not None:
            # Imported only when asked for: aiohttp is the HTTP API's dependency alone.
            from radixmesh.router.http.app import HttpFrontend

            self.http = HttpFrontend(self.dispatch, self.control, c, grpc_port=self.port)
            http_port = await self.http.start(c.host, c.http_port, self.http_cap)
            if self.keyless is not None and c.caller_keys:
                self.keyless.sources["http"] = self.http.guard
            print(f"radixmesh router HTTP (OpenAI and SGLang APIs) on port {http_port}", flush=True)


async def _start_serving(control: ControlPlane, health: Any, stop: asyncio.Event) -> bool:
    """Wait for a healthy worker, read the model, then SERVING. False: stopped first."""
    while not stop.is_set() and not await control.pool.wait_healthy(timeout=5.0):
        logger.info("no worker is healthy yet")
    if stop.is_set():
        return False
    await control.load_model_info()
    control.pool.start()
    await set_health(health, SERVICE_NAME, serving=True)
    return True


def _say_serving(control: ControlPlane, port: int) -> None:
    assert control.model_info is not None
    print(
        f"radixmesh router serving {control.model_info.model} on port {port} "
        f"({len(control.pool.workers)} workers, policy {control.config.policy})",
        flush=True,
    )


def run(config: RouterConfig) -> int:
    log_limit.configure(logging.INFO)  # and at most a burst a place an interval
    return asyncio.run(serve(config))
