"""Every refusal for want of a worker says when to retry: each HTTP 503 carries
Retry-After, each gRPC UNAVAILABLE the router sends carries retry-after metadata, which the
SDK reads into `Unavailable.retry_after`.

The router here is the real one (`serve`, gRPC and HTTP on loopback) in front of a worker
address nothing listens on: it opens its ports at once and stays "still starting", so
every route of its HTTP API is asked as it is.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import grpc
import pytest

from radixmesh.client.convert import error_from_rpc
from radixmesh.cluster.launch import free_port
from radixmesh.errors import Overloaded, Unavailable
from radixmesh.router.config import RouterConfig
from radixmesh.router.control import ControlPlane
from radixmesh.router.dispatch import Dispatcher
from radixmesh.router.http.api_error import ApiError
from radixmesh.router.http.app import HttpFrontend
from radixmesh.router.metrics import RouterMetrics
from radixmesh.router.pool import WorkerPool
from radixmesh.router.server import serve
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc

# A body every POST route takes far enough to ask for the model (unknown fields ignored).
BODY = {
    "model": "m",
    "prompt": "hi",
    "messages": [{"role": "user", "content": "hi"}],
    "input": "hi",
    "text": "hi",
    "tokens": [1],
}
# What a router that has no worker yet refuses with 503; the rest answer on their own.
REFUSED = {
    "GET /health",
    "GET /health_generate",
    "GET /v1/models",
    "GET /v1/models/x",
    "GET /get_model_info",
    "GET /model_info",
    "GET /get_server_info",
    "GET /server_info",
    "POST /tokenize",
    "POST /detokenize",
    "POST /v1/completions",
    "POST /v1/chat/completions",
    "POST /v1/embeddings",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "POST /v1/responses",
    "POST /v1/responses/input_tokens",
    "POST /generate",
    "PUT /generate",
    "GET /ping",
    "GET /ready",
    "POST /v1/score",
    "POST /v1/rerank",
    "PUT /v1/rerank",
    "POST /rerank",
    "POST /v2/rerank",
    "POST /score",
}


def routes(config: RouterConfig) -> list[tuple[str, str]]:
    """Every (method, path) of the router's HTTP API, path parameters filled in."""
    pool = WorkerPool(config)
    metrics = RouterMetrics(pool)
    control = ControlPlane(config, pool, metrics)
    app = HttpFrontend(Dispatcher(config, control, metrics), control, config).build_app()
    found = []
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        path = route.resource.canonical if route.resource is not None else ""
        found.append((route.method, path.replace("{model}", "x")))
    return found


def test_every_503_and_unavailable_of_a_starting_router_says_when_to_retry() -> None:
    config = RouterConfig(
        workers=(f"127.0.0.1:{free_port()}",),
        host="127.0.0.1",
        port=free_port(),
        http_port=free_port(),
    )

    async def run() -> tuple[dict[str, tuple[int, str | None]], list[Any]]:
        stop = asyncio.Event()
        router = asyncio.create_task(serve(config, stop=stop))
        try:
            answers = await ask_every_route(config)
            errors = await ask_over_grpc(config)
        finally:
            stop.set()
            await router
        return answers, errors

    answers, errors = asyncio.run(asyncio.wait_for(run(), 60))
    refused = {route for route, (status, _) in answers.items() if status == 503}
    assert refused == REFUSED
    assert {after for status, after in answers.values() if status == 503} == {"1"}
    for e in errors:
        assert e.code() == grpc.StatusCode.UNAVAILABLE
        assert e.details() == "the router is still starting"
        assert ("radixmesh-retry-after", "1") in tuple(e.trailing_metadata())
        sdk_error = error_from_rpc(e)
        assert isinstance(sdk_error, Unavailable) and sdk_error.retry_after == 1.0


async def ask_every_route(config: RouterConfig) -> dict[str, tuple[int, str | None]]:
    """Each route's status and Retry-After header."""
    url = f"http://127.0.0.1:{config.http_port}"
    answers: dict[str, tuple[int, str | None]] = {}
    async with aiohttp.ClientSession() as session:
        for _ in range(100):  # the port opens right after serve() starts
            try:
                async with session.get(url + "/metrics"):
                    break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.05)
        for method, path in routes(config):
            body = BODY if method in ("POST", "PUT") else None
            async with session.request(method, url + path, json=body) as resp:
                await resp.read()
                answers[f"{method} {path}"] = (resp.status, resp.headers.get("Retry-After"))
    return answers


async def ask_over_grpc(config: RouterConfig) -> list[grpc.aio.AioRpcError]:
    errors = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{config.port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        request = router_pb2.RouterGenerateRequest(input=common_pb2.Input(text="hi"))
        try:
            async for _ in stub.Generate(request, timeout=10):
                pass
        except grpc.aio.AioRpcError as e:
            errors.append(e)
        try:
            await stub.GetModelInfo(router_pb2.RouterGetModelInfoRequest(), timeout=10)
        except grpc.aio.AioRpcError as e:
            errors.append(e)
    assert len(errors) == 2
    return errors


@pytest.mark.parametrize(
    ("error", "header"),
    [
        (Unavailable("no healthy worker"), "1"),  # the router's default
        (Unavailable("draining", retry_after=3.2), "4"),  # whole seconds, rounded up
        (Unavailable("soon", retry_after=0.1), "1"),  # at least one
        (Overloaded("full", retry_after=2.0), "2"),
    ],
)
def test_the_retry_after_header_of_an_error(error: Exception, header: str) -> None:
    response = ApiError.from_exception(error).response()
    assert response.headers["Retry-After"] == header


def test_only_429_and_503_carry_retry_after() -> None:
    assert ApiError(503, "down").response().headers["Retry-After"] == "1"
    assert "Retry-After" not in ApiError(400, "bad", "prompt").response().headers
    assert "Retry-After" not in ApiError(404, "no route").response().headers
