"""Resumable streams: a router replica SIGKILLed with streams open, its clients resume
through the other replica (`radixmesh launch --routers 2`, one dummy:tiny worker in
deterministic mode, so a stream's tokens do not depend on who else runs).

The SDK resumes on its own; an SSE client sends its last event's id as Last-Event-ID.
Either way the text put together equals an uninterrupted greedy run's exactly. A stream
nobody resumes is aborted once the worker's grace period passes: every KV slot back.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from radixmesh.client import Chunk, Client
from radixmesh.cluster.child import RestartPolicy
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.errors import NotFound
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.cluster.sse import read_events
from tests.cluster.test_router_replicas import replica_ids

pytestmark = pytest.mark.slow

GRACE = 3.0  # the worker's --resume-grace
WORKER_ARGS = ("--dtype", "float32", "--deterministic", "--resume-grace", str(GRACE))
FLAGS = {"health_interval": 0.2, "stream_stall_timeout": 2.0, "drain_timeout": 1.0}
# Long enough that every stream is still generating when its router is killed.
PARAMS = {"max_new_tokens": 512, "temperature": 0.0, "ignore_eos": True}
PROMPTS = [[3 + (11 * i + 7 * j) % 500 for j in range(20)] for i in range(4)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    spec = LaunchSpec(
        model="dummy:tiny",
        workers=1,
        routers=2,
        port=free_port(),
        worker_args=WORKER_ARGS,
        router_options={**FLAGS, "http_port": free_port()},
        ready_timeout=120.0,
        # Each module using this fixture SIGKILLs a replica up to 5 times, and which of the
        # two is hit depends on who answers: room for every kill to land on one of them.
        restart=RestartPolicy(max_restarts=10, restart_backoff=0.2),
    )
    with LocalCluster(spec) as c:
        stop = threading.Event()

        def tend() -> None:  # restart a killed replica, as `radixmesh launch` does
            while not stop.wait(0.2):
                assert c.failure() is None

        tender = threading.Thread(target=tend, daemon=True)
        tender.start()
        try:
            yield c
        finally:
            stop.set()
            tender.join(timeout=5)


@pytest.fixture(scope="module")
def reference(cluster: LocalCluster) -> list[tuple[str, list[int]]]:
    """Each prompt's uninterrupted greedy text and ids (generated together: in
    deterministic mode a request's tokens do not depend on its batch)."""
    with Client(cluster.address, timeout=120) as client, ThreadPoolExecutor(4) as pool:
        outs = list(
            pool.map(lambda p: client.generate(input_ids=p, sampling_params=PARAMS), PROMPTS)
        )
    return [(o.text, o.token_ids) for o in outs]


def _pid_of(router_id: str) -> int:
    return int(router_id.rsplit(":", 1)[1])


def _both_replicas(cluster: LocalCluster) -> None:
    deadline = time.monotonic() + 60
    while len(replica_ids(cluster.address, tries=16)) < 2:  # the launcher restarted it
        assert time.monotonic() < deadline, "the killed replica did not come back"
        time.sleep(0.3)


def _idle_worker(cluster: LocalCluster) -> worker_pb2.GetLoadResponse:
    """The worker's load once nothing runs there (a finished stream's last steps)."""
    md = (("authorization", f"Bearer {cluster.worker_key}"),)
    with grpc.insecure_channel(cluster.worker_addresses[0]) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        deadline = time.monotonic() + 30
        while (load := stub.GetLoad(worker_pb2.GetLoadRequest(), metadata=md)).num_in_flight:
            assert time.monotonic() < deadline, load
            time.sleep(0.1)
        assert stub.FlushCache(worker_pb2.FlushCacheRequest(), metadata=md).flushed
        return stub.GetLoad(worker_pb2.GetLoadRequest(), metadata=md)


def test_sdk_streams_resume_through_the_other_replica(
    cluster: LocalCluster, reference: list[tuple[str, list[int]]]
) -> None:
    _both_replicas(cluster)
    client = Client(cluster.address, timeout=60)
    try:
        # One connection carries every call of this client: the replica it reached dies.
        (channel,) = client._channels.channels()
        status = router_pb2_grpc.RouterStub(channel).ClusterStatus(
            router_pb2.ClusterStatusRequest(), timeout=10
        )
        victim = _pid_of(status.router_id)
        chunks: list[list[Chunk]] = [[] for _ in PROMPTS]
        started = [threading.Event() for _ in PROMPTS]
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                for chunk in client.generate(
                    input_ids=PROMPTS[i], sampling_params=PARAMS, stream=True
                ):
                    chunks[i].append(chunk)
                    if chunk.token_ids:
                        started[i].set()
            except BaseException as e:
                errors.append(e)
                started[i].set()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for e in started:
            assert e.wait(60)
        assert all(c[-1].finish_reason is None for c in chunks)  # every stream is cut
        os.kill(victim, signal.SIGKILL)
        for t in threads:
            t.join(60)
        assert errors == []
    finally:
        client.close()
    for got, (text, ids) in zip(chunks, reference, strict=True):
        assert "".join(c.text for c in got) == text
        assert [t for c in got for t in c.token_ids] == ids
        assert got[-1].finish_reason == "length"
        assert [c.offset for c in got] == [c.completion_tokens for c in got]
        assert len({c.stream_id for c in got}) == 1 and got[0].stream_id
    assert _idle_worker(cluster).kv_tokens_used == 0


def _post_stream(port: int, body: dict[str, Any], last_event_id: str | None = None) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    return conn, resp


def _reconnect(port: int, body: dict[str, Any], last_id: str) -> Any:
    """The resume, sent again (as an SSE client reconnects) while a connection reaches
    the killed replica's socket before the kernel has closed it."""
    for _ in range(50):
        try:
            return _post_stream(port, body, last_event_id=last_id)
        except ConnectionError:
            time.sleep(0.1)
    raise AssertionError("no replica took the resume")


def _events(resp: Any, until: int | None = None) -> list[tuple[str | None, str]]:
    """(id, data) of the SSE events read (`until`: stop after that many)."""
    return [(event_id, data) for event_id, _, data in read_events(resp, until)]


def test_an_sse_stream_resumes_with_last_event_id(
    cluster: LocalCluster, reference: list[tuple[str, list[int]]]
) -> None:
    _both_replicas(cluster)
    port = int(cluster.config.router_options["http_port"])
    body = {"model": "dummy:tiny", "prompt": PROMPTS[0], "stream": True}
    body |= {"max_tokens": PARAMS["max_new_tokens"], "temperature": 0, "ignore_eos": True}
    conn, resp = _post_stream(port, body)
    victim = _pid_of(resp.getheader("X-Radixmesh-Router"))
    before = _events(resp, until=3)
    assert all(event_id for event_id, _ in before)
    os.kill(victim, signal.SIGKILL)
    before += _events(resp)  # what was on its way, then the cut: no [DONE]
    conn.close()
    assert before[-1][1] != "[DONE]"
    last_id = before[-1][0]
    assert last_id is not None
    conn, resp = _reconnect(port, body, last_id)
    after = _events(resp)
    conn.close()
    assert after[-1] == (None, "[DONE]")
    texts = [json.loads(data)["choices"][0]["text"] for _, data in before + after[:-1]]
    assert "".join(texts) == reference[0][0]
    assert _idle_worker(cluster).kv_tokens_used == 0


def test_a_stream_nobody_resumes_is_aborted_after_the_grace(cluster: LocalCluster) -> None:
    _both_replicas(cluster)
    client = Client(cluster.address, timeout=60)
    (channel,) = client._channels.channels()
    status = router_pb2_grpc.RouterStub(channel).ClusterStatus(
        router_pb2.ClusterStatusRequest(), timeout=10
    )
    # Long enough to be generating still when the grace passes.
    params = common_pb2.SamplingParams(max_new_tokens=2000, temperature=0.0, ignore_eos=True)
    call = router_pb2_grpc.RouterStub(channel).Generate(
        router_pb2.RouterGenerateRequest(
            input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=PROMPTS[1])),
            sampling_params=params,
            stream=True,
        ),
        timeout=60,
    )
    first = next(call)
    assert first.stream_id and first.offset == first.chunk.completion_tokens
    os.kill(_pid_of(status.router_id), signal.SIGKILL)
    with pytest.raises(grpc.RpcError):
        list(call)
    client.close()
    time.sleep(GRACE + 1.0)
    load = _idle_worker(cluster)
    assert (load.num_running, load.num_waiting, load.num_in_flight) == (0, 0, 0)
    assert load.kv_tokens_used == 0
    with Client(cluster.address, timeout=30) as again, pytest.raises(NotFound) as lost:
        list(again.resume(first.stream_id, first.offset))
    assert f"{GRACE:g} s grace period" in str(lost.value)


def test_a_finished_stream_resumed_at_its_end_gets_its_finish_again(
    cluster: LocalCluster,
) -> None:
    """A caller whose router died after the last chunk but before the call's end resumes
    at the stream's end: it gets the finish again with no tokens (once, that resume
    waited for a chunk that never came, until the caller's deadline)."""
    _both_replicas(cluster)
    params = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    with Client(cluster.address, timeout=30) as client:
        for _ in range(3):  # the worker holds a finished stream for GRACE s
            chunks = list(
                client.generate(input_ids=PROMPTS[2], sampling_params=params, stream=True)
            )
            last = chunks[-1]
            assert (last.finish_reason, last.offset) == ("length", 6)
            try:
                again = list(client.resume(last.stream_id, last.offset))
                break
            except NotFound:  # the machine stalled past the grace between the two calls
                continue
        else:
            pytest.fail("three resumes came after the grace")
    assert [(c.token_ids, c.text, c.finish_reason, c.offset) for c in again] == [
        ([], "", "length", 6)
    ]
