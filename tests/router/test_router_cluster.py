"""The router's cluster behaviour over real processes on loopback (dummy:tiny, float32).

- With two workers whose KV pools hold two of four prefix groups each, cache_aware serves
  at least 1.5x the cached tokens of round_robin and keeps each group on one worker.
- A router with a tiny summary budget keeps its summaries under it and still routes.
- A worker SIGKILLed mid-run: the request queued there (nothing streamed yet) finishes
  on the other worker, the stream it was sending ends UNAVAILABLE, nothing hangs, and
  the router reports the worker unhealthy.

The module's cluster runs the cache_aware router; the round_robin and small-budget
routers are extra `radixmesh router` processes in front of the same workers. The kill
test has its own cluster. (Prefix stickiness in a roomy pool, summaries equal to worker
snapshots, resync after an event gap and retry before the first token are in
test_router_e2e.py.)
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.router.pool import snapshot_blocks
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.router.routers import ExtraRouter

pytestmark = pytest.mark.slow

# A pool of 700 tokens holds two 300-token group prefixes (and a running request), not 4.
POOL_TOKENS = 700
PREFIX_LEN = 300
BLOCK = 16
WORKER_ARGS = (
    "--dtype",
    "float32",
    "--event-block-size",
    str(BLOCK),
    "--kv-cache-tokens",
    str(POOL_TOKENS),
)
SHORT = common_pb2.SamplingParams(max_new_tokens=2, temperature=0.0)
WORKER_KEY = "test-worker-key"  # the launcher's workers always require one
WORKER_MD = (("authorization", f"Bearer {WORKER_KEY}"),)


def _launch(worker_args: tuple[str, ...] = WORKER_ARGS) -> LocalCluster:
    return LocalCluster(
        LaunchSpec(
            model="dummy:tiny",
            workers=2,
            port=free_port(),
            worker_args=worker_args,
            router_options={"health_interval": 0.2, "seed": 0},
            ready_timeout=120.0,
            worker_api_key=WORKER_KEY,
        )
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with _launch() as c:
        yield c


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _request(text: str, params: common_pb2.SamplingParams = SHORT, stream: bool = False) -> Any:
    return router_pb2.RouterGenerateRequest(
        input=common_pb2.Input(text=text), sampling_params=params, stream=stream
    )


def _generate(address: str, text: str) -> router_pb2.RouterGenerateResponse:
    with grpc.insecure_channel(address) as ch:
        (resp,) = list(router_pb2_grpc.RouterStub(ch).Generate(_request(text), timeout=60))
    return resp


def _status(address: str) -> dict[str, router_pb2.WorkerStatus]:
    with grpc.insecure_channel(address) as ch:
        resp = router_pb2_grpc.RouterStub(ch).ClusterStatus(
            router_pb2.ClusterStatusRequest(), timeout=5
        )
    return {w.worker_id: w for w in resp.workers}


def _flush(address: str) -> None:
    def flushed() -> bool:  # a worker refuses while a finished request is being reaped
        with grpc.insecure_channel(address) as ch:
            resp = router_pb2_grpc.RouterStub(ch).FlushCache(router_pb2.RouterFlushCacheRequest())
        return resp.flushed == resp.total

    _wait_for(flushed)


def _snapshot_blocks(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        snap = worker_pb2_grpc.WorkerStub(ch).GetCacheSnapshot(
            worker_pb2.GetCacheSnapshotRequest(), metadata=WORKER_MD
        )
    return len(snapshot_blocks(snap.events))


def _prefix(group: int) -> str:
    """A 300-character (= byte-token) system prompt, different from its first character."""
    text = f"{chr(ord('A') + group)} group {group} shares this system prompt. "
    return (text * (PREFIX_LEN // len(text) + 1))[:PREFIX_LEN]


def _grouped_workload(address: str) -> list[tuple[int, str, int]]:
    """4 groups x 3 back-to-back requests, twice over; (group, worker, cached tokens)."""
    out = []
    n = 0
    for _ in range(2):
        for group in range(4):
            for _ in range(3):
                resp = _generate(address, f"{_prefix(group)} question {n}")
                out.append((group, resp.worker_id, resp.chunk.cached_tokens))
                n += 1
    return out


def test_cache_aware_caches_more_than_round_robin_in_small_pools(cluster: LocalCluster) -> None:
    _flush(cluster.address)
    aware = _grouped_workload(cluster.address)
    _flush(cluster.address)
    with ExtraRouter(cluster, "--policy", "round_robin") as rr:
        robin = _grouped_workload(rr.address)
    # round_robin alternates workers strictly, so a group's triple is split 2 + 1.
    assert [w for _, w, _ in robin] == [f"worker-{i % 2}" for i in range(24)]
    # cache_aware: each triple stays on one worker (nothing else is running).
    for i in range(0, 24, 3):
        assert len({w for _, w, _ in aware[i : i + 3]}) == 1, aware[i : i + 3]
    aware_cached = sum(c for _, _, c in aware)
    robin_cached = sum(c for _, _, c in robin)
    # Each triple: cache_aware hits twice (>= 16 hits of >= 300 tokens); round_robin at
    # most on the third request of a triple and where a pool still holds the group.
    assert aware_cached >= 16 * PREFIX_LEN
    assert aware_cached >= 1.5 * robin_cached, (aware_cached, robin_cached)
    print(f"cached tokens: cache_aware {aware_cached}, round_robin {robin_cached}")


def test_a_tiny_summary_budget_evicts_and_still_routes(cluster: LocalCluster) -> None:
    budget = 20 * 100  # 20 blocks at BYTES_PER_BLOCK = 100; one 300-token prefix is 18
    _flush(cluster.address)
    with ExtraRouter(cluster, "--summary-budget-bytes", str(budget), "--seed", "0") as small:
        served = [_generate(small.address, f"{_prefix(g)} budget {g}") for g in range(4)]
        assert all(len(r.chunk.token_ids) == 2 for r in served)
        assert {r.worker_id for r in served} <= {"worker-0", "worker-1"}
        # The workers now cache more blocks than the budget admits ...
        cached = sum(_snapshot_blocks(a) for a in cluster.worker_addresses)
        assert cached >= 2 * (PREFIX_LEN // BLOCK) > budget // 100
        # ... and the router's summaries stay within it.
        time.sleep(0.5)  # let the stored events arrive
        summarized = sum(w.cached_blocks for w in _status(small.address).values())
        assert 0 < summarized <= budget // 100
        again = _generate(small.address, f"{_prefix(3)} budget again")
        assert len(again.chunk.token_ids) == 2


def test_a_stream_id_that_names_no_worker_is_resumed_by_asking_each(
    cluster: LocalCluster,
) -> None:
    """A stream id whose epoch is all zeros (made by a replica that had not synced its
    worker's epoch yet) names no worker: a resume asks each worker in turn, and the one
    holding the stream serves it; an id no worker holds is NOT_FOUND once all said so."""
    unknown = "0" * 16
    with grpc.insecure_channel(cluster.address) as ch:
        stub = router_pb2_grpc.RouterStub(ch)
        chunks = list(stub.Generate(_request("resume me", stream=True), timeout=60))
        _, rid = chunks[0].stream_id.split("/")
        resume = router_pb2.ResumeRequest(stream_id=f"{unknown}/{rid}", offset=0)
        resumed = list(stub.Resume(resume, timeout=60))
        nobodys = router_pb2.ResumeRequest(stream_id=f"{unknown}/{'ab' * 16}")
        with pytest.raises(grpc.RpcError) as missing:
            list(stub.Resume(nobodys, timeout=60))
    assert [t for c in resumed for t in c.chunk.token_ids] == [
        t for c in chunks for t in c.chunk.token_ids
    ]
    assert {c.worker_id for c in resumed} == {chunks[0].worker_id}  # no keys: shown to all
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_worker_killed_mid_run() -> None:
    # One running request per worker: a second request routed to a busy worker waits.
    with _launch((*WORKER_ARGS[:4], "--max-running-requests", "1")) as c:  # default pool
        prefix = _prefix(0)
        victim = _generate(c.address, prefix + " warm").worker_id
        index = int(victim.removeprefix("worker-"))
        long = common_pb2.SamplingParams(max_new_tokens=1500, temperature=0.0, ignore_eos=True)
        with grpc.insecure_channel(c.address) as ch:
            stub = router_pb2_grpc.RouterStub(ch)
            stream = stub.Generate(_request(prefix + " stream", long, stream=True), timeout=60)
            first = next(stream)
            assert first.worker_id == victim  # it holds the prefix

            queued: list[router_pb2.RouterGenerateResponse | grpc.RpcError] = []

            def send_queued() -> None:
                try:
                    req = _request(prefix + " queued", stream=True)
                    queued.extend(stub.Generate(req, timeout=60))
                except grpc.RpcError as e:
                    queued.append(e)

            thread = threading.Thread(target=send_queued)
            thread.start()
            with grpc.insecure_channel(c.worker_addresses[index]) as wch:
                load = worker_pb2_grpc.WorkerStub(wch).GetLoad

                _wait_for(
                    lambda: load(worker_pb2.GetLoadRequest(), metadata=WORKER_MD).num_waiting == 1
                )
            t0 = time.monotonic()
            os.kill(c.workers[index].pid, signal.SIGKILL)
            c.workers[index].wait()
            with pytest.raises(grpc.RpcError) as err:
                for _ in stream:
                    pass
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            thread.join(timeout=60)
            assert not thread.is_alive()
            assert time.monotonic() - t0 < 30
        other = f"worker-{1 - index}"
        chunks = [r for r in queued if isinstance(r, router_pb2.RouterGenerateResponse)]
        assert chunks and len(chunks) == len(queued), queued  # no error: it was retried
        assert {r.worker_id for r in chunks} == {other}
        assert sum(len(r.chunk.token_ids) for r in chunks) == 2
        _wait_for(lambda: not _status(c.address)[victim].healthy)
        assert _status(c.address)[other].healthy
        assert _generate(c.address, "after the kill").worker_id == other
