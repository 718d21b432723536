"""The router over real worker processes on loopback (dummy:tiny, float32).

One two-worker cluster serves the routing and summary tests; the retry test gets its
own cluster because it kills a worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import grpc
import pytest

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.router.config import RouterConfig
from radixmesh.router.pool import WorkerHandle, snapshot_blocks
from radixmesh.router.summary import PrefixSummary
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc

pytestmark = pytest.mark.slow

WORKER_ARGS = ("--dtype", "float32", "--event-block-size", "16")
WORKER_KEY = "test-worker-key"  # the launcher's workers always require one
WORKER_MD = (("authorization", f"Bearer {WORKER_KEY}"),)
GREEDY = common_pb2.SamplingParams(max_new_tokens=4, temperature=0.0)


def _cluster(**kw: object) -> LocalCluster:
    config = LaunchSpec(
        model="dummy:tiny",
        workers=2,
        port=free_port(),
        worker_args=WORKER_ARGS,
        ready_timeout=120.0,
        worker_api_key=WORKER_KEY,
        **kw,  # type: ignore[arg-type]
    )
    return LocalCluster(config)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with _cluster(router_options={"health_interval": 0.2, "seed": 0}) as c:
        yield c


def _generate(address: str, text: str) -> tuple[str, common_pb2.GenerateChunk]:
    with grpc.insecure_channel(address) as ch:
        stub = router_pb2_grpc.RouterStub(ch)
        req = router_pb2.RouterGenerateRequest(
            input=common_pb2.Input(text=text), sampling_params=GREEDY
        )
        (resp,) = list(stub.Generate(req, timeout=60))
    return resp.worker_id, resp.chunk


def _status(address: str) -> dict[str, router_pb2.WorkerStatus]:
    with grpc.insecure_channel(address) as ch:
        resp = router_pb2_grpc.RouterStub(ch).ClusterStatus(router_pb2.ClusterStatusRequest())
    return {w.worker_id: w for w in resp.workers}


def _snapshot_blocks(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        snap = worker_pb2_grpc.WorkerStub(ch).GetCacheSnapshot(
            worker_pb2.GetCacheSnapshotRequest(), metadata=WORKER_MD
        )
    return len(snapshot_blocks(snap.events))


def _wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_shared_prefix_goes_to_the_worker_that_holds_it(cluster: LocalCluster) -> None:
    prefix = "The quick brown fox jumps over the lazy dog; " * 4  # 180 byte tokens
    first, chunk = _generate(cluster.address, prefix + "first")
    assert chunk.cached_tokens == 0
    for suffix in ("second", "third", "fourth"):
        worker, chunk = _generate(cluster.address, prefix + suffix)
        assert worker == first
        assert chunk.cached_tokens >= 176  # 11 full blocks of 16 (a page-aligned match)


def test_summaries_track_inserts_and_flushes(cluster: LocalCluster) -> None:
    for text in ("alpha " * 20, "beta " * 25, "gamma " * 30):
        _generate(cluster.address, text)
    addresses = dict(zip(["worker-0", "worker-1"], cluster.worker_addresses, strict=True))

    def summaries_match() -> bool:
        status = _status(cluster.address)
        return all(status[w].cached_blocks == _snapshot_blocks(a) for w, a in addresses.items())

    _wait_for(summaries_match)
    assert sum(w.cached_blocks for w in _status(cluster.address).values()) > 0

    def flush() -> bool:  # a worker refuses while a just-finished request is being reaped
        with grpc.insecure_channel(cluster.address) as ch:
            stub = router_pb2_grpc.RouterStub(ch)
            resp = stub.FlushCache(router_pb2.RouterFlushCacheRequest())
        assert resp.total == 2
        return resp.flushed == 2

    _wait_for(flush)
    _wait_for(lambda: all(w.cached_blocks == 0 for w in _status(cluster.address).values()))


def test_summary_resyncs_from_a_snapshot_after_a_gap(cluster: LocalCluster) -> None:
    """A WorkerHandle in this process follows worker 0's events; we skip a sequence number."""

    async def run() -> tuple[int, int, int]:
        address = cluster.worker_addresses[0]
        config = RouterConfig(workers=(address,), health_interval=0.2, worker_api_key=WORKER_KEY)
        handle = WorkerHandle("w", address, PrefixSummary(), config)
        handle.start()
        try:
            while handle.resyncs == 0:
                await asyncio.sleep(0.05)
            handle.summary.sequence -= 1  # as if one event had been lost
            handle.summary.store([12345])  # ... and the summary were wrong
            async with grpc.aio.insecure_channel(address) as ch:
                stub = worker_pb2_grpc.WorkerStub(ch)
                req = worker_pb2.GenerateRequest(
                    input=common_pb2.Input(text="delta " * 20 + str(time.time())),
                    sampling_params=GREEDY,
                )
                async for _ in stub.Generate(req, metadata=WORKER_MD):
                    pass
            deadline = time.monotonic() + 10
            while handle.resyncs < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # let the stream catch up with the snapshot
            return handle.resyncs, handle.summary.match([12345]), handle.summary.num_confirmed
        finally:
            await handle.close()

    resyncs, bogus, confirmed = asyncio.run(run())
    assert resyncs == 2
    assert bogus == 0  # the snapshot replaced the wrong contents
    assert confirmed == _snapshot_blocks(cluster.worker_addresses[0])


def test_sdk_client_through_the_router_matches_the_engine(cluster: LocalCluster) -> None:
    from radixmesh.client import Client
    from radixmesh.worker.engine import Engine

    prompt = "Routing through the router should not change a greedy answer."
    params = {"max_new_tokens": 8, "temperature": 0.0}
    with Client(cluster.address) as client:
        via_router = client.generate(prompt, sampling_params=params)
    engine = Engine(model="dummy:tiny", dtype="float32")
    try:
        ids = engine.tokenizer.encode(prompt)
        local = engine.generate(input_ids=ids, sampling_params=params)
    finally:
        engine.shutdown()
    assert isinstance(local, dict)
    assert via_router.token_ids == local["output_ids"]


def test_bad_input_is_invalid_argument(cluster: LocalCluster) -> None:
    with grpc.insecure_channel(cluster.address) as ch:
        stub = router_pb2_grpc.RouterStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(router_pb2.RouterGenerateRequest(), timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "input: empty input: set token_ids, text or messages"


def test_a_worker_killed_before_the_first_token_is_retried_elsewhere() -> None:
    # A long health interval: the router has not noticed the death when the request comes.
    with _cluster(router_options={"health_interval": 60.0, "seed": 0}) as c:
        prompt = "a prompt whose prefix one worker caches " * 3
        first, chunk = _generate(c.address, prompt)
        index = int(first.removeprefix("worker-"))
        os.kill(c.workers[index].pid, signal.SIGKILL)
        c.workers[index].wait()
        # cache_aware sends the prompt to the dead worker (it holds the prefix) first.
        second, again = _generate(c.address, prompt)
        assert second != first
        assert list(again.token_ids) == list(chunk.token_ids)
        assert again.cached_tokens == 0


def test_abort_and_select_through_the_router(cluster: LocalCluster) -> None:
    from radixmesh.client import Client

    with Client(cluster.address) as client:
        stream = client.generate(
            "count forever",
            sampling_params={"max_new_tokens": 2000, "ignore_eos": True},
            request_id="long-one",
            stream=True,
        )
        first = next(stream)
        assert first.request_id == "long-one"
        assert client.abort("long-one") is True
        last = list(stream)[-1]
        assert last.finish_reason == "abort"
        assert client.abort("long-one") is False
        sel = client.select("The sky is", ["blue", "green", "loud"])
    assert sel.text == ["blue", "green", "loud"][sel.index]
    assert len(sel.normalized_logprobs) == 3 and len(sel.sum_logprobs) == 3
    best = max(range(3), key=lambda i: (sel.normalized_logprobs[i], -i))
    assert sel.index == best
