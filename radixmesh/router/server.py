"""The router process: the Router service, health and reflection on one port.

It starts listening at once (health NOT_SERVING), waits for a worker to answer, loads the
tokenizer that worker names, then turns SERVING. SIGTERM / SIGINT stop it.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from radixmesh.router.config import RouterConfig
from radixmesh.router.pool import WorkerPool
from radixmesh.router.service import RouterServicer
from radixmesh.v1 import router_pb2, router_pb2_grpc

logger = logging.getLogger(__name__)

_SERVER_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
]
SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name


async def serve(config: RouterConfig, ready: asyncio.Event | None = None) -> int:
    server = grpc.aio.server(options=_SERVER_OPTIONS)
    pool = WorkerPool(config)
    servicer = RouterServicer(config, pool)
    router_pb2_grpc.add_RouterServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    await _set_health(health_servicer, serving=False)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logger.info("radixmesh router on port %d; waiting for workers", port)
    while not stop.is_set() and not await pool.wait_healthy(timeout=5.0):
        logger.info("no worker is healthy yet")
    if not stop.is_set():
        await servicer.load_model_info()
        pool.start()
        await _set_health(health_servicer, serving=True)
        assert servicer.model_info is not None
        print(
            f"radixmesh router serving {servicer.model_info.model} on port {port} "
            f"({len(pool.workers)} workers, policy {config.policy})",
            flush=True,
        )
        if ready is not None:
            ready.set()
        await stop.wait()
    await _set_health(health_servicer, serving=False)
    await server.stop(grace=2.0)
    await pool.close()
    return 0


async def _set_health(servicer: health.aio.HealthServicer, *, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", SERVICE_NAME):
        await servicer.set(name, status)


def run(config: RouterConfig) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return asyncio.run(serve(config))
