"""Router replicas: `radixmesh launch --routers 2` on loopback with dummy:tiny workers.

Both replicas share the router's port (SO_REUSEPORT) and each follows every worker's
cache events, so each routes by the same exact summaries: both take connections, a
replica SIGKILLed under load loses no request that had not started streaming while the
other serves on (and the launcher restarts it), a seeded shared-prefix trace hits the
caches as much through two replicas as through one, and a replica started while the
cluster is warm routes by the warm summaries from its first request.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from radixmesh.client import Client
from radixmesh.cluster.child import RestartPolicy
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc
from tests.cluster.test_faults import LOSS_BOUND_S, Load

pytestmark = pytest.mark.slow

FLAGS = {"health_interval": 0.2, "stream_stall_timeout": 2.0, "drain_timeout": 1.0}
BLOCK = 16  # the workers' event block size: prefixes are whole blocks
# A prefix of 8 blocks outweighs any load a replica may see on its holder (cache_aware
# counts 64 tokens per request a worker runs, and a poll may still show the last one):
# placements never hang on a near tie.
PREFIX = 8 * BLOCK
WORKER_ARGS = ("--dtype", "float32", "--event-block-size", str(BLOCK))


@contextmanager
def replicas(routers: int) -> Iterator[LocalCluster]:
    """A launched cluster of two workers and `routers` replicas, tended (restarts) as
    `radixmesh launch` tends it."""
    spec = LaunchSpec(
        model="dummy:tiny",
        workers=2,
        routers=routers,
        port=free_port(),
        worker_args=WORKER_ARGS,
        router_options=dict(FLAGS),
        ready_timeout=120.0,
        restart=RestartPolicy(max_restarts=3, restart_backoff=0.2),
    )
    with LocalCluster(spec) as cluster:
        stop = threading.Event()

        def tend() -> None:
            while not stop.wait(0.2):
                assert cluster.failure() is None

        tender = threading.Thread(target=tend, daemon=True)
        tender.start()
        try:
            yield cluster
        finally:
            stop.set()
            tender.join(timeout=5)


@pytest.fixture(scope="module")
def two() -> Iterator[LocalCluster]:
    with replicas(2) as cluster:
        yield cluster


def status_of_a_replica(address: str) -> tuple[grpc.Channel, router_pb2.ClusterStatusResponse]:
    """A new connection to `address` (the kernel picks the replica) and that replica's
    ClusterStatus; the caller closes the channel."""
    ch = grpc.insecure_channel(address, [("grpc.use_local_subchannel_pool", 1)])
    try:
        status = router_pb2_grpc.RouterStub(ch).ClusterStatus(
            router_pb2.ClusterStatusRequest(), timeout=5
        )
    except BaseException:
        ch.close()
        raise
    return ch, status


@contextmanager
def replica_channel(address: str, router_id: str | None = None) -> Iterator[grpc.Channel]:
    """A connection that reached replica `router_id` (any, when None)."""
    for _ in range(200):
        ch, status = status_of_a_replica(address)
        if router_id is None or status.router_id == router_id:
            try:
                yield ch
            finally:
                ch.close()
            return
        ch.close()
    raise AssertionError(f"no connection reached replica {router_id}")


def replica_ids(address: str, tries: int = 64) -> set[str]:
    """The replicas that new connections to `address` reached."""
    ids = set()
    for _ in range(tries):
        ch, status = status_of_a_replica(address)
        ch.close()
        ids.add(status.router_id)
    return ids


def cached_blocks(address: str, router_id: str) -> dict[str, int]:
    with replica_channel(address, router_id) as ch:
        status = router_pb2_grpc.RouterStub(ch).ClusterStatus(
            router_pb2.ClusterStatusRequest(), timeout=5
        )
    return {w.worker_id: w.cached_blocks for w in status.workers}


def wait_agreed(address: str, ids: set[str], timeout: float = 20.0) -> dict[str, int]:
    """Until every replica holds the same summaries (cache events reach each on its own
    stream); the blocks per worker they agree on."""
    deadline = time.monotonic() + timeout
    while True:
        seen = [cached_blocks(address, rid) for rid in sorted(ids)]
        if all(s == seen[0] for s in seen):
            return seen[0]
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)


def test_both_replicas_take_connections(two: LocalCluster) -> None:
    assert len(two.routers) == 2
    assert len(replica_ids(two.address)) == 2


def test_a_replica_killed_under_load_loses_nothing_and_comes_back(two: LocalCluster) -> None:
    victim = two.routers[1]
    with Load(two.address, bound_s=LOSS_BOUND_S) as load:
        time.sleep(1.0)
        victim.send_signal(signal.SIGKILL)
        time.sleep(2.0)
    finished, failed = load.check()  # none lost before its first token; errors Unavailable
    assert finished > failed
    deadline = time.monotonic() + 60
    while len(replica_ids(two.address, tries=16)) < 2:  # the launcher restarted it
        assert time.monotonic() < deadline, "the killed replica did not come back"
        time.sleep(0.5)
    assert two.routers[1].pid != victim.pid


def shared_prefix_trace(seed: int) -> list[list[int]]:
    """4 groups of a PREFIX-token prefix + 16 own tokens, 3 requests a group, interleaved."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 500) for _ in range(PREFIX)] for _ in range(4)]
    trace = [p + [rng.randrange(3, 500) for _ in range(BLOCK)] for p in prefixes * 3]
    return trace


def cached_tokens_of(cluster: LocalCluster, trace: list[list[int]]) -> list[int]:
    """Each request's cached prompt tokens, sent one at a time, alternating over the
    replicas; each request waits until every replica has the previous one's events."""
    ids = replica_ids(cluster.address)
    assert len(ids) == cluster.config.routers
    order = sorted(ids)
    cached = []
    for i, prompt in enumerate(trace):
        with replica_channel(cluster.address, order[i % len(order)]) as ch:
            call = router_pb2_grpc.RouterStub(ch).Generate(
                router_pb2.RouterGenerateRequest(
                    input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=prompt)),
                    sampling_params=common_pb2.SamplingParams(max_new_tokens=2, temperature=0.0),
                ),
                timeout=30,
            )
            last = list(call)[-1].chunk
        assert last.HasField("finish")
        cached.append(last.cached_tokens)
        wait_agreed(cluster.address, ids)
    return cached


def _flush(cluster: LocalCluster) -> None:
    with Client(cluster.address) as c:
        assert c.flush_cache()


def test_two_replicas_hit_the_caches_as_one_does(two: LocalCluster) -> None:
    trace = shared_prefix_trace(seed=7)
    _flush(two)
    through_two = cached_tokens_of(two, trace)
    with replicas(1) as one:
        through_one = cached_tokens_of(one, trace)
    # Each group's first request is cold; every later one finds its prefix.
    assert through_one == [0] * 4 + [PREFIX] * 8
    assert through_two == through_one


def test_a_late_replica_routes_by_the_warm_summaries(two: LocalCluster) -> None:
    _flush(two)
    prompts = shared_prefix_trace(seed=11)[:4]
    with Client(two.address, timeout=30) as client:
        homes = [
            client.generate(input_ids=p, sampling_params={"max_new_tokens": 2}).worker_id
            for p in prompts
        ]
    old = replica_ids(two.address)
    warm = wait_agreed(two.address, old)
    env = {**os.environ, "RADIXMESH_WORKER_API_KEY": two.worker_key}
    cmd = [sys.executable, "-m", "radixmesh.cluster.cli", "router", "--listen-when-serving"]
    cmd += ["--workers", ",".join(two.worker_addresses), "--host", "127.0.0.1"]
    cmd += ["--port", str(two.config.port), "--health-interval", "0.2"]
    late = subprocess.Popen(cmd, env=env)
    try:
        deadline = time.monotonic() + 60
        while len(ids := replica_ids(two.address, tries=24)) < 3:
            assert late.poll() is None and time.monotonic() < deadline
            time.sleep(0.3)
        (new,) = ids - old
        # Its summaries came from the workers' snapshots: the same as the warm replicas'.
        assert wait_agreed(two.address, ids) == warm
        # Its first requests go where the prefixes are cached, and hit.
        for prompt, home in zip(prompts, homes, strict=True):
            with replica_channel(two.address, new) as ch:
                call = router_pb2_grpc.RouterStub(ch).Generate(
                    router_pb2.RouterGenerateRequest(
                        input=common_pb2.Input(
                            token_ids=common_pb2.TokenIds(ids=prompt[:PREFIX] + [9] * 8)
                        ),
                        sampling_params=common_pb2.SamplingParams(max_new_tokens=2),
                    ),
                    timeout=30,
                )
                reply = list(call)
            assert reply[-1].worker_id == home
            assert reply[-1].chunk.cached_tokens == PREFIX
    finally:
        late.send_signal(signal.SIGTERM)
        try:
            late.wait(timeout=15)
        except subprocess.TimeoutExpired:
            late.kill()
            late.wait()
