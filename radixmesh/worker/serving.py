"""The worker process: `radixmesh worker` serves one engine over gRPC until a signal.

It starts listening before the model loads (health NOT_SERVING, RPCs UNAVAILABLE), turns
SERVING once the engine is up, and on SIGTERM / SIGINT drains: NOT_SERVING, new requests
UNAVAILABLE, requests in flight finish up to `drain_timeout`, the rest are aborted, then
it exits. An engine that fails (a TP rank, the engine process) ends it with status 1, so
the launcher or Ray restarts the whole worker. The service itself: server.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import grpc

from radixmesh import log_limit, redact
from radixmesh.auth import ApiKeyInterceptor
from radixmesh.gate import Gate, KeylessCollector
from radixmesh.grpc_server import (
    DecodeGuard,
    add_health_and_reflection,
    bind,
    set_health,
)
from radixmesh.listener import (
    GATED_DESCRIPTORS,
    ListenerLimits,
    Tally,
    connection_cap,
    raise_descriptor_limit,
)
from radixmesh.v1 import worker_pb2_grpc
from radixmesh.worker.cache_event_hub import CacheEventHub
from radixmesh.worker.engine_process import EngineProcess
from radixmesh.worker.metrics import MODEL_LABEL
from radixmesh.worker.stats_log import log_stats

if TYPE_CHECKING:
    from radixmesh.worker.serving_engine import ServingEngine
from radixmesh.worker.server import SERVICE_NAME, ServerConfig, WorkerServicer, grpc_options

logger = logging.getLogger(__name__)


def served_model_name(engine_options: dict[str, Any]) -> str:
    """The name clients see (ModelInfo.model, the metrics' model_name label)."""
    from radixmesh.worker.config import ModelConfig

    model = engine_options.get("model") or ModelConfig.model
    return str(engine_options.get("served_model_name") or model)


async def serve(config: ServerConfig, engine_options: dict[str, Any]) -> int:
    """Run a worker until SIGTERM / SIGINT, then drain. Returns the exit status."""
    redact.install([config.api_key] if config.api_key else [])  # no key in a log line
    loop = asyncio.get_running_loop()
    cap = connection_cap(ListenerLimits(), 1, raise_descriptor_limit())
    gate = _gate(config, cap)
    interceptors: list[grpc.aio.ServerInterceptor] = [DecodeGuard()]
    if config.api_key:
        on_outcome = None if gate is None else gate.report
        interceptors.append(ApiKeyInterceptor([config.api_key], on_outcome=on_outcome))
    server = grpc.aio.server(
        options=grpc_options(config.max_message_bytes, cap), interceptors=interceptors
    )
    model_name = served_model_name(engine_options)
    servicer = WorkerServicer(config, model_name)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    health_servicer = add_health_and_reflection(server, SERVICE_NAME)
    if gate is not None:
        servicer.metrics.registry.register(
            KeylessCollector({"grpc": gate}, {MODEL_LABEL: model_name})
        )
    await set_health(health_servicer, SERVICE_NAME, serving=False)
    port = await _listen(config, server, gate)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if config.metrics_port is not None:
        servicer.metrics.serve(config.metrics_port, config.host)
    logger.info("radixmesh worker listening on %s:%d; loading the model", config.host, port)
    engine: ServingEngine
    if config.engine_process:
        engine = await asyncio.to_thread(EngineProcess, engine_options)
    else:
        from radixmesh.worker.engine import Engine

        engine = await asyncio.to_thread(Engine, **engine_options)
    hub = CacheEventHub(engine, loop)
    servicer.attach(engine, hub)
    await set_health(health_servicer, SERVICE_NAME, serving=not stop.is_set())
    print(f"radixmesh worker serving {engine.config.model.model} on port {port}", flush=True)
    stats_log = asyncio.create_task(log_stats(engine, config.log_stats_interval))
    try:
        if await _stopped_or_failed(stop, engine):
            return await _fail(servicer, engine, health_servicer, hub, server)
    finally:
        stats_log.cancel()
    await _drain(config, servicer, engine, health_servicer)
    hub.close()
    servicer.close_output_streams()
    if gate is not None:
        await gate.close()
    await server.stop(grace=2.0)
    await asyncio.to_thread(engine.shutdown)
    logger.info("radixmesh worker stopped")
    return 0


def _gate(config: ServerConfig, cap: int) -> Gate | None:
    """The port's gate (gate.py) when the worker takes a key: a connection that does not
    authenticate is closed, and keyless ones never take the router's place."""
    if not config.api_key:
        return None
    tls = bool(config.tls_cert and config.tls_key)
    return Gate(ListenerLimits(), max(1, cap // GATED_DESCRIPTORS), Tally("gRPC port"), tls=tls)


async def _listen(config: ServerConfig, server: grpc.aio.Server, gate: Gate | None) -> int:
    """Start `server` on the configured address, or on loopback behind `gate`; returns the
    public port. A port that cannot be had (another server holds it: a worker's port is
    never shared) ends the process with one line that names it."""
    c = config
    try:
        if gate is None:
            port = bind(server, f"{c.host}:{c.port}", c.tls_cert, c.tls_key, c.tls_client_ca)
            await server.start()
            return port
        inner = bind(server, "127.0.0.1:0", c.tls_cert, c.tls_key, c.tls_client_ca)
        await server.start()
        port = await gate.start(c.host, c.port, inner, reuse_port=False)
    except (OSError, RuntimeError) as e:  # grpc-core's bind failure is a RuntimeError
        await server.stop(None)
        raise SystemExit(f"radixmesh worker: cannot listen on {c.host}:{c.port}: {e}") from None
    gate.tally.name = f"gRPC port {port}"
    return port


FAILURE_POLL_S = 0.2
FAILURE_GRACE_S = 1.0  # in-flight streams see UNAVAILABLE (their waiters poll) before exit


async def _stopped_or_failed(stop: asyncio.Event, engine: ServingEngine) -> bool:
    """Wait for SIGTERM / SIGINT (False) or for the engine to fail, e.g. a TP rank (True)."""
    while not stop.is_set():
        if engine.fatal is not None:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), FAILURE_POLL_S)
    return False


async def _fail(
    servicer: WorkerServicer,
    engine: ServingEngine,
    health_servicer: Any,
    hub: Any,
    server: Any,
) -> int:
    """The engine cannot serve: NOT_SERVING, in-flight requests end UNAVAILABLE, exit 1
    (so the launcher or Ray restarts the whole worker)."""
    logger.error("worker failed, exiting: %s", engine.fatal)
    await set_health(health_servicer, SERVICE_NAME, serving=False)
    deadline = time.monotonic() + FAILURE_GRACE_S
    while servicer.busy and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    hub.close()
    servicer.close_output_streams()
    await server.stop(grace=0.5)
    await asyncio.to_thread(engine.shutdown)
    return 1


async def _drain(
    config: ServerConfig,
    servicer: WorkerServicer,
    engine: ServingEngine,
    health_servicer: Any,
) -> None:
    logger.info("draining: %d requests in flight", len(servicer.in_flight))
    await set_health(health_servicer, SERVICE_NAME, serving=False)
    engine.drain()
    deadline = time.monotonic() + config.drain_timeout
    while servicer.unsent and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if servicer.unsent:
        logger.info("drain timeout: aborting %d requests", servicer.unsent)
        engine.abort_all("the worker is shutting down")
        deadline = time.monotonic() + 5.0
        while servicer.unsent and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


def run(config: ServerConfig, engine_options: dict[str, Any]) -> int:
    log_limit.configure(logging.INFO)  # and at most a burst a place an interval
    code = asyncio.run(serve(config, engine_options))
    # Only a process that loaded torch can hold a process group. The engine runs in a
    # child, so this one usually never did, and importing tp.group would load torch just
    # to find no group (3-9 s at every worker's exit on a loaded 2-core machine).
    if "torch" in sys.modules:
        from radixmesh.worker.tp.group import exit_if_group_alive

        exit_if_group_alive(code)  # TP on CUDA: the NCCL group outlives the engine
    if code != 0:
        # A failed TP group may leave a thread blocked in a collective that interpreter
        # teardown would wait on: leave now, with the status the launcher acts on.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
