"""A busy worker is not a dead one, end to end: the real router (gRPC + HTTP, `serve`) in
front of a real worker servicer over dummy:tiny, both in this process on loopback.

Busy is made deterministic, not loaded: the worker's GetLoad is delayed past the router's
health timeout (the servicer's `health_delay`) while requests stream through it, which is
what a worker under a burst on a small machine looks like to the router. The router must
serve every request of the burst (before: the first timed-out poll marked the only
worker down, and every later request was a 503 "no healthy worker"). Then the worker's
server stops (dead: connections refused): the router marks it down at once, and every
refusal says when to retry: HTTP Retry-After, gRPC retry-after metadata, the SDK error's
`retry_after`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
import grpc
import pytest

from radixmesh.client.convert import error_from_rpc
from radixmesh.cluster.launch import free_port
from radixmesh.errors import Unavailable
from radixmesh.router.config import RouterConfig
from radixmesh.router.pool import WorkerPool
from radixmesh.router.server import serve
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from radixmesh.wire import load_age
from radixmesh.worker.cache_event_hub import CacheEventHub
from radixmesh.worker.engine import Engine
from radixmesh.worker.server import ServerConfig, WorkerServicer, grpc_options

pytestmark = pytest.mark.slow

ENGINE: dict[str, Any] = {"model": "dummy:tiny", "dtype": "float32", "kv_cache_tokens": 4096}
BODY = {"text": "a busy worker", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}


class SlowHealth(WorkerServicer):
    """The worker's servicer, its GetLoad answered `health_delay` seconds late."""

    health_delay = 0.0

    async def GetLoad(
        self, request: worker_pb2.GetLoadRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetLoadResponse:
        await asyncio.sleep(self.health_delay)
        return await super().GetLoad(request, context)


async def until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def burst(session: aiohttp.ClientSession, url: str, done: Callable[[], bool]) -> Counter[int]:
    """8 clients sending /generate requests back to back until `done()`: the statuses."""
    statuses: Counter[int] = Counter()

    async def client() -> None:
        while not done():
            async with session.post(url, json=BODY) as resp:
                await resp.read()
                statuses[resp.status] += 1

    await asyncio.gather(*(client() for _ in range(8)))
    return statuses


def test_a_busy_worker_serves_a_burst_a_dead_one_is_refused_with_retry_after() -> None:
    engine = Engine(**ENGINE)
    try:
        asyncio.run(asyncio.wait_for(scenario(engine), 120))
    finally:
        engine.shutdown()


async def scenario(engine: Engine) -> None:
    loop = asyncio.get_running_loop()
    servicer = SlowHealth(ServerConfig(host="127.0.0.1", port=0, engine_process=False))
    hub = CacheEventHub(engine, loop)
    servicer.attach(engine, hub)
    worker = grpc.aio.server(options=grpc_options(64 * 1024 * 1024, 1024))
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, worker)
    worker_address = f"127.0.0.1:{worker.add_insecure_port('127.0.0.1:0')}"
    await worker.start()
    config = RouterConfig(
        workers=(worker_address,),
        host="127.0.0.1",
        port=free_port(),
        http_port=free_port(),
        health_interval=0.1,
        health_timeout=0.3,
        liveness_window=5.0,
    )
    pool = WorkerPool(config)
    handle = pool.workers["worker-0"]
    ready, stop = asyncio.Event(), asyncio.Event()
    router = asyncio.create_task(serve(config, ready, pool=pool, stop=stop))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        await answers_while_the_engine_is_stuck(engine, worker_address)
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{config.http_port}"
            servicer.health_delay = 1.0  # every poll now passes the 0.3 s health timeout
            give_up = time.monotonic() + 15.0
            statuses = await burst(
                session,
                url + "/generate",
                lambda: handle.slow_polls >= 5 or time.monotonic() > give_up,
            )
            assert set(statuses) == {200} and statuses[200] >= 8, statuses
            assert handle.slow_polls >= 5
            assert handle.reachable and handle.breaker.state == "closed"

            servicer.health_delay = 0.0
            await worker.stop(grace=None)  # dead: the next poll is refused
            await until(lambda: not handle.reachable)
            for method, path in (("POST", "/generate"), ("GET", "/health")):
                async with session.request(method, url + path, json=BODY) as resp:
                    assert resp.status == 503, await resp.text()
                    assert resp.headers["Retry-After"] == "1"
        await refused_over_grpc_with_retry_after(config)
    finally:
        stop.set()
        await router
        await worker.stop(grace=None)
        hub.close()


async def answers_while_the_engine_is_stuck(engine: Engine, address: str) -> None:
    """GetLoad answers from the server's last read while the scheduler cannot (before: it
    waited for the scheduler and passed any health timeout), and says how old that is."""
    stuck = threading.Event()

    def hold_the_scheduler() -> None:
        stuck.set()
        time.sleep(1.5)

    blocker = threading.Thread(target=engine.call, args=(hold_the_scheduler,), daemon=True)
    blocker.start()
    await asyncio.to_thread(stuck.wait, 10)
    await asyncio.sleep(0.3)
    async with grpc.aio.insecure_channel(address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).GetLoad(worker_pb2.GetLoadRequest(), timeout=0.6)
        await call
        assert load_age(await call.trailing_metadata()) >= 0.25
    await asyncio.to_thread(blocker.join, 10)


async def refused_over_grpc_with_retry_after(config: RouterConfig) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{config.port}") as channel:
        request = router_pb2.RouterGenerateRequest(input=common_pb2.Input(text="no worker"))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for _ in router_pb2_grpc.RouterStub(channel).Generate(request, timeout=10):
                pass
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ("radixmesh-retry-after", "1") in tuple(e.value.trailing_metadata() or ())
    error = error_from_rpc(e.value)
    assert isinstance(error, Unavailable) and error.retry_after == 1.0
