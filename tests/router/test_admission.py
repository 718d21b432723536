"""Admission control at the router (router/admission.py): the slot queue and the token
buckets on their own, then a 3,000-request burst against a launched one-worker cluster
that admits 16 at once and queues 32: the rest are shed with 429 and a Retry-After at
once, the router's memory stays bounded, every admitted request completes, and the
workers' load accounting (pending prefill, requests in flight) is back to zero. Then
3,000 gRPC streams at once on one channel, to the worker and to the router: each is
served or refused RESOURCE_EXHAUSTED as overloaded, none CANCELLED. And a 4 MiB prompt
does not hold the router's event loop."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import grpc
import psutil
import pytest

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.errors import OVERLOADED_METADATA_KEY, Overloaded, Unavailable
from radixmesh.router.admission import Admission, RateLimiter
from radixmesh.v1 import common_pb2, router_pb2, worker_pb2
from tests.router.http_helpers import Http
from tests.router.routers import ExtraRouter

# ---- the parts alone ---------------------------------------------------------------------


def test_slots_queue_then_refuse_and_hand_over_in_order() -> None:
    async def run() -> None:
        a = Admission(max_concurrent=2, max_queued=1, queue_timeout=5.0)
        order: list[str] = []
        hold = asyncio.Event()

        async def request(name: str) -> None:
            async with a.slot():
                order.append(name)
                await hold.wait()

        first = [asyncio.create_task(request(n)) for n in ("a", "b", "c")]
        await asyncio.sleep(0.01)
        assert (a.active, a.waiting, order) == (2, 1, ["a", "b"])
        with pytest.raises(Overloaded) as e:  # the queue is full: refused at once
            await request("d")
        assert e.value.retry_after == 1.0 and a.refused == 1
        hold.set()
        await asyncio.gather(*first)
        assert (a.active, a.waiting, order) == (0, 0, ["a", "b", "c"])

    asyncio.run(run())


def test_a_wait_past_the_timeout_is_refused_and_leaks_no_slot() -> None:
    async def run() -> None:
        a = Admission(max_concurrent=1, max_queued=4, queue_timeout=0.05)
        async with a.slot():
            with pytest.raises(Overloaded, match=r"no turn within 0\.05 s"):
                async with a.slot():
                    pass
            waiter = asyncio.create_task(a.slot().__aenter__())
            await asyncio.sleep(0)
            waiter.cancel()  # a client gone while it waited
            await asyncio.gather(waiter, return_exceptions=True)
        assert (a.active, a.waiting) == (0, 0)
        a.close("draining")
        with pytest.raises(Unavailable, match="draining"):
            async with a.slot():
                pass

    asyncio.run(run())


def test_token_buckets_per_caller() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    for _ in range(3):
        limiter.take("alpha")
    with pytest.raises(Overloaded) as e:
        limiter.take("alpha")
    assert e.value.retry_after == pytest.approx(0.5)
    limiter.take("beta")  # another caller has its own bucket
    now[0] = 0.5  # one token back
    limiter.take("alpha")
    with pytest.raises(Overloaded):
        limiter.take("alpha")
    assert limiter.refused == 2
    RateLimiter(rate=0.0, burst=0).take("anyone")  # no limit


# ---- a burst against a cluster -----------------------------------------------------------

CONCURRENT, QUEUED = 16, 32
BURST = 3000
WORKER_QUEUED = 256  # the worker's own queue, behind its running requests


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalCluster, int]]:
    http_port = free_port()
    router_options = {
        "http_port": http_port, "health_interval": 0.2,
        "max_concurrent_requests": CONCURRENT, "max_queued_requests": QUEUED,
        "queue_timeout": 20.0,
    }  # fmt: skip
    config = LaunchSpec(
        model="dummy:tiny",
        workers=1,
        port=free_port(),
        worker_args=("--dtype", "float32", "--max-queued-requests", str(WORKER_QUEUED)),
        router_options=router_options,
        ready_timeout=120.0,
    )
    with LocalCluster(config) as c:
        yield c, http_port


BODY = json.dumps(
    {"model": "dummy:tiny", "prompt": "burst ", "max_tokens": 8, "ignore_eos": True}
).encode()


async def _post(port: int, key: str = "") -> tuple[int, dict[str, str], bytes]:
    """One POST /v1/completions on its own connection (asyncio streams, no client lib)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode() + BODY)
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    header, _, body = raw.partition(b"\r\n\r\n")
    lines = header.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def _metric(port: int, name: str, key: str | None = None) -> float:
    """A metric's value from a router's HTTP port (`key`: its admin key, where it has keys)."""
    text = Http(port, api_key=key).get("/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.slow
def test_a_burst_is_shed_with_429_and_memory_stays_bounded(
    cluster: tuple[LocalCluster, int],
) -> None:
    c, port = cluster
    assert c.router is not None
    router = psutil.Process(c.router.pid)
    rss_before = router.memory_info().rss

    async def burst() -> list[tuple[int, dict[str, str], bytes]]:
        limit = asyncio.Semaphore(500)  # this process's open sockets

        async def one() -> tuple[int, dict[str, str], bytes]:
            async with limit:
                return await _post(port)

        return await asyncio.gather(*(one() for _ in range(BURST)))

    peak = 0
    t0 = time.monotonic()
    results = asyncio.run(burst())
    took = time.monotonic() - t0
    peak = max(peak, router.memory_info().rss)
    statuses = [s for s, _, _ in results]
    ok, shed = statuses.count(200), statuses.count(429)
    assert ok + shed == BURST, sorted(set(statuses))
    assert ok >= CONCURRENT + QUEUED and shed > BURST // 2
    for status, headers, body in results:
        if status == 429:
            assert int(headers["retry-after"]) >= 1
            error = json.loads(body)["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", "resource_exhausted")
        else:
            assert json.loads(body)["usage"]["completion_tokens"] == 8
    assert peak - rss_before < 150 * 2**20, (rss_before, peak)
    # Nothing refused or shed left load behind on the worker's accounting.
    deadline = time.monotonic() + 10
    while _metric(port, "radixmesh_router_admitted_requests") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metric(port, "radixmesh_router_worker_pending_prefill_tokens") == 0
    assert _metric(port, "radixmesh_router_worker_requests_in_flight") == 0
    assert _metric(port, "radixmesh_router_queued_requests") == 0
    assert _metric(port, 'radixmesh_router_refused_requests_total{reason="queue"}') == shed
    print(f"burst of {BURST}: {ok} served, {shed} shed in {took:.1f} s; router RSS "
          f"{rss_before / 2**20:.0f} -> {peak / 2**20:.0f} MiB")  # fmt: skip


@pytest.mark.slow
def test_a_caller_past_its_rate_gets_429_with_retry_after(
    cluster: tuple[LocalCluster, int],
) -> None:
    """A second router on the same worker, with keys and a rate limit of one request every
    two seconds, in bursts of up to five (and an admin key, for its metrics)."""
    c, _ = cluster
    keys = ("--api-key", "alpha", "--api-key", "b", "--admin-key", "root")
    args = ("--rate-limit", "0.5", "--rate-burst", "5", *keys)
    with ExtraRouter(c, *args, http=True, key="root") as limited:
        port = limited.http_port
        assert port is not None

        async def run(key: str, count: int) -> list[tuple[int, dict[str, str], bytes]]:
            # At once: the bucket gets a token back every 2 s.
            return list(await asyncio.gather(*(_post(port, key) for _ in range(count))))

        results = asyncio.run(run("alpha", 8))
        assert sorted(s for s, _, _ in results) == [200] * 5 + [429] * 3
        for status, headers, body in results:
            if status == 429:
                assert headers["retry-after"] in ("1", "2")  # what the bucket lacks
                message = json.loads(body)["error"]["message"]
                assert message == "rate limit: 0.5 requests a second (burst 5)"
        assert [s for s, _, _ in asyncio.run(run("b", 5))] == [200] * 5  # its own bucket
        refused = 'radixmesh_router_refused_requests_total{reason="rate_limit"}'
        assert _metric(port, refused, key="root") == 3


# ---- thousands of streams on one connection ------------------------------------------------


def _stream_burst(address: str, service: str, request: bytes, md: tuple) -> dict[str, int]:
    """BURST streams at once on one channel; the status of each (its code, and for
    RESOURCE_EXHAUSTED whether the server said it was overloaded)."""
    statuses: dict[str, int] = {}

    async def run() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_stream(f"/radixmesh.v1.{service}/Generate")

            async def one() -> None:
                try:
                    async for _ in call(request, metadata=md, timeout=120):
                        pass
                    name = "OK"
                except grpc.aio.AioRpcError as e:
                    name = e.code().name
                    trailers = dict(e.trailing_metadata() or ())
                    if name == "RESOURCE_EXHAUSTED" and OVERLOADED_METADATA_KEY in trailers:
                        name += " (overloaded)"
                statuses[name] = statuses.get(name, 0) + 1

            await asyncio.gather(*(one() for _ in range(BURST)))

    asyncio.run(run())
    return statuses


@pytest.mark.slow
def test_thousands_of_streams_on_one_channel_get_resource_exhausted_never_cancelled(
    cluster: tuple[LocalCluster, int],
) -> None:
    """Past gRPC core's default of 1,000 calls waiting for the server, a burst ended
    CANCELLED; now the worker's and the router's admission answer every call."""
    c, _ = cluster
    params = common_pb2.SamplingParams(max_new_tokens=4, ignore_eos=True)
    direct = worker_pb2.GenerateRequest(
        input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=[5, 6, 7])),
        sampling_params=params,
        stream=True,
    ).SerializeToString()
    md = (("authorization", f"Bearer {c.worker_key}"),)
    worker = _stream_burst(c.worker_addresses[0], "Worker", direct, md)
    # Every call answered: served, or refused by admission when the burst outruns the
    # worker (how many depends on the machine's speed); none CANCELLED by gRPC core.
    assert set(worker) <= {"OK", "RESOURCE_EXHAUSTED (overloaded)"}, worker
    assert worker["OK"] >= WORKER_QUEUED
    routed = router_pb2.RouterGenerateRequest(
        input=common_pb2.Input(text="burst"), sampling_params=params, stream=True
    ).SerializeToString()
    router = _stream_burst(c.address, "Router", routed, ())
    assert set(router) <= {"OK", "RESOURCE_EXHAUSTED (overloaded)"}, router
    assert router["OK"] >= CONCURRENT + QUEUED
    print(f"{BURST} streams on one channel: worker {worker}, router {router}")


@pytest.mark.slow
def test_tokenizing_a_prompt_at_the_limit_does_not_stall_the_router(
    cluster: tuple[LocalCluster, int],
) -> None:
    """A 4 MiB prompt (the default limit) is parsed and tokenized on threads: meanwhile
    the router's event loop answers /health at once. (Its tokens are past the context: a
    400 naming the prompt, after the work.)"""
    _, port = cluster
    text = "word " * (4 * 2**20 // 5 - 16)
    big = json.dumps({"model": "dummy:tiny", "prompt": text, "max_tokens": 1})
    done = threading.Event()
    answer: list[tuple[int, str]] = []

    def post() -> None:
        resp = Http(port).post("/v1/completions", big.encode())
        answer.append((resp.status_code, resp.json()["error"]["param"]))
        done.set()

    thread = threading.Thread(target=post)
    t0 = time.monotonic()
    thread.start()
    slowest = 0.0
    polls = 0
    while not done.is_set():
        t = time.monotonic()
        assert Http(port).get("/health").status_code == 200
        slowest = max(slowest, time.monotonic() - t)
        polls += 1
        time.sleep(0.02)
    thread.join()
    took = time.monotonic() - t0
    assert answer == [(400, "prompt")]  # the prompt alone is past the context
    assert slowest < 0.25, (slowest, took)
    print(f"a 4 MiB prompt tokenized in {took:.1f} s; /health answered {polls} times "
          f"meanwhile, the slowest in {slowest * 1000:.0f} ms")  # fmt: skip
