"""The gRPC worker: a real `radixmesh worker` process on loopback, driven through the SDK.

One worker process serves the whole module (float32, so its greedy output equals the
in-process engine's token for token). It requires an API key, allows 4 Generate streams
in flight (2 running + 2 queued), and the last test drains it with SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.client import (
    AsyncClient,
    Chunk,
    Client,
    Completion,
    DeadlineExceeded,
    InvalidArgument,
    Overloaded,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    convert,
)
from radixmesh.prefix import block_hashes
from radixmesh.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from radixmesh.worker.engine import Engine

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key"
MD = (("authorization", f"Bearer {API_KEY}"),)
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
GREEDY = {"temperature": 0.0, "max_new_tokens": 16}
LONG = {"temperature": 0.0, "max_new_tokens": 2000, "ignore_eos": True}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WorkerProcess:
    def __init__(self, log: Path) -> None:
        self.port, self.metrics_port = _free_port(), _free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "radixmesh.cluster.cli", "worker", "--model", "smollm2"]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--metrics-port", str(self.metrics_port), "--api-key", API_KEY]
        cmd += ["--dtype", "float32", "--kv-cache-tokens", "4096", "--drain-timeout", "30"]
        cmd += ["--max-running-requests", "2", "--max-queued-requests", "2"]
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)

    def logs(self) -> str:
        return self.log.read_text()


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path) -> Iterator[WorkerProcess]:
    w = WorkerProcess(tmp_path_factory.mktemp("worker") / "worker.log")
    try:
        with Client(w.target, api_key=API_KEY) as c:
            deadline = time.monotonic() + 180
            while not c.health():
                assert w.proc.poll() is None, w.logs()
                assert time.monotonic() < deadline, w.logs()
                time.sleep(0.2)
        yield w
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait(timeout=30)


@pytest.fixture
def client(worker: WorkerProcess) -> Iterator[Client]:
    with Client(worker.target, api_key=API_KEY, timeout=120) as c:
        yield c


@pytest.fixture
def stub(worker: WorkerProcess) -> Iterator[worker_pb2_grpc.WorkerStub]:
    with grpc.insecure_channel(worker.target) as ch:
        yield worker_pb2_grpc.WorkerStub(ch)


def _wait_idle(client: Client) -> None:
    """Every request gone from the worker: nothing running, waiting or in flight."""
    deadline = time.monotonic() + 30
    while True:
        load = client.load()
        if (load.num_running, load.num_waiting, load.num_in_flight) == (0, 0, 0):
            return
        assert time.monotonic() < deadline, load
        time.sleep(0.05)


def _wait_running(client: Client, n: int) -> None:
    """The worker's load shows n running requests (its stats are a snapshot the scheduler
    publishes after a step, so they can trail the stream's first chunks)."""
    deadline = time.monotonic() + 30
    while (load := client.load()).num_running != n:
        assert time.monotonic() < deadline, load
        time.sleep(0.05)


def _assert_kv_back_to_zero(client: Client) -> None:
    _wait_idle(client)
    stub = client._worker  # FlushCache is a worker RPC the SDK does not wrap
    assert stub.FlushCache(worker_pb2.FlushCacheRequest(), metadata=MD).flushed
    load = client.load()
    assert (load.kv_tokens_used, load.num_running, load.num_waiting) == (0, 0, 0)


def _engine_out(engine: Engine, ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
    out = engine.generate(input_ids=ids, sampling_params=params)
    assert isinstance(out, dict)
    return out


# ---- serving ------------------------------------------------------------------------------


def test_health_serving_for_process_and_service(worker: WorkerProcess) -> None:
    with Client(worker.target) as c:  # health needs no API key
        assert c.health("")
        assert c.health("radixmesh.v1.Worker")


def test_model_info(client: Client, engine: Engine) -> None:
    info = client.model_info()
    assert (info.model, info.vocab_size, info.context_length) == ("smollm2", 49152, 4096)
    assert (info.page_size, info.event_block_size) == (1, 16)
    assert info.eos_token_ids == sorted(engine.worker.eos_ids)
    assert "<|im_start|>" in info.chat_template


def test_unary_generate_matches_engine(client: Client, engine: Engine) -> None:
    out = client.generate(messages=QUESTION, sampling_params=GREEDY)
    ref = _engine_out(engine, engine.tokenizer.encode_chat(QUESTION), GREEDY)
    assert isinstance(out, Completion)
    assert out.text == ref["text"] == "The capital of France is Paris."
    assert out.token_ids == ref["output_ids"]
    assert out.finish_reason == "stop"
    assert out.matched_stop == ref["meta_info"]["finish_reason"]["matched"]
    assert (out.prompt_tokens, out.completion_tokens) == (
        ref["meta_info"]["prompt_tokens"],
        len(ref["output_ids"]),
    )


def test_streamed_generate_matches_engine(client: Client, engine: Engine) -> None:
    params = {
        "temperature": 0.0,
        "max_new_tokens": 12,
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    chunks = list(client.generate("Once upon a time", params, stream=True))
    ref = _engine_out(engine, engine.tokenizer.encode("Once upon a time"), params)
    assert all(isinstance(c, Chunk) for c in chunks)
    assert [t for c in chunks for t in c.token_ids] == ref["output_ids"]
    assert "".join(c.text for c in chunks) == ref["text"]
    assert [c.completion_tokens for c in chunks] == list(range(1, 13))
    assert [c.finish_reason for c in chunks] == [None] * 11 + ["length"]
    assert [lp.token_id for c in chunks for lp in c.logprobs] == ref["output_ids"]
    ref_lps = [lp for lp, _, _ in ref["meta_info"]["output_token_logprobs"]]
    assert [lp.logprob for c in chunks for lp in c.logprobs] == pytest.approx(ref_lps, abs=1e-4)
    tops = [[t.token_id for t in top] for c in chunks for top in c.top_logprobs]
    ref_tops = [[t for _, t, _ in top] for top in ref["meta_info"]["output_top_logprobs"]]
    assert tops == ref_tops
    assert [top[0] for top in tops] == ref["output_ids"]  # greedy: the best is the chosen
    unary = client.generate("Once upon a time", params)
    assert [[t.token_id for t in top] for top in unary.top_logprobs] == ref_tops


def test_two_concurrent_streams(client: Client, engine: Engine) -> None:
    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = {"temperature": 0.0, "max_new_tokens": 10, "ignore_eos": True}
    results: dict[str, list[int]] = {}
    started = threading.Barrier(2)

    def run(prompt: str) -> None:
        started.wait()
        results[prompt] = [
            t for c in client.generate(prompt, params, stream=True) for t in c.token_ids
        ]

    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for p in prompts:
        assert results[p] == _engine_out(engine, engine.tokenizer.encode(p), params)["output_ids"]
    _wait_idle(client)


def test_async_client_generates_the_same(worker: WorkerProcess, engine: Engine) -> None:
    async def run() -> tuple[Completion, list[int]]:
        async with AsyncClient(worker.target, api_key=API_KEY, timeout=120) as ac:
            out = await ac.generate(messages=QUESTION, sampling_params=GREEDY)
            assert isinstance(out, Completion)
            stream = await ac.generate(messages=QUESTION, sampling_params=GREEDY, stream=True)
            assert not isinstance(stream, Completion)
            return out, [t async for c in stream for t in c.token_ids]

    out, streamed = asyncio.run(run())
    ref = _engine_out(engine, engine.tokenizer.encode_chat(QUESTION), GREEDY)
    assert out.token_ids == streamed == ref["output_ids"]


def _generate_request(prompt: list[int], rid: str, **fields: Any) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=prompt)),
        sampling_params=common_pb2.SamplingParams(temperature=0.0, max_new_tokens=12),
        request_id=rid,
        **fields,
    )


def test_first_and_rest_sends_two_messages(
    stub: worker_pb2_grpc.WorkerStub, engine: Engine
) -> None:
    ids = engine.tokenizer.encode("Once upon a time")
    ref = _engine_out(engine, ids, {"temperature": 0.0, "max_new_tokens": 12})
    req = _generate_request(ids, "first-rest", first_and_rest=True)
    chunks = [r.chunk for r in stub.Generate(req, metadata=MD)]
    # The first step's output (more steps' if the server's loop was behind), then the rest:
    # two messages, or one when the first output was already the whole reply.
    assert 1 <= len(chunks) <= 2
    assert [c.HasField("finish") for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert [t for c in chunks for t in c.token_ids] == ref["output_ids"]
    assert "".join(c.text for c in chunks) == ref["text"]
    assert chunks[-1].completion_tokens == 12


def test_output_stream_carries_the_requests_that_name_it(
    stub: worker_pb2_grpc.WorkerStub, engine: Engine
) -> None:
    ids = engine.tokenizer.encode("Once upon a time")
    ref = _engine_out(engine, ids, {"temperature": 0.0, "max_new_tokens": 12})
    outputs = stub.StreamOutputs(worker_pb2.StreamOutputsRequest(stream_id="s1"), metadata=MD)
    try:
        outputs.initial_metadata()  # the name is open
        again = stub.StreamOutputs(worker_pb2.StreamOutputsRequest(stream_id="s1"), metadata=MD)
        with pytest.raises(grpc.RpcError) as taken:
            next(again)
        assert taken.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        streamed = _generate_request(ids, "on-stream", stream=True, output_stream="s1")
        whole = _generate_request(ids, "on-stream-2", first_and_rest=True, output_stream="s1")
        # Both calls end with no message: their chunks go to the output stream.
        assert list(stub.Generate(streamed, metadata=MD)) == []
        assert list(stub.Generate(whole, metadata=MD)) == []
        got: dict[str, list[common_pb2.GenerateChunk]] = {"on-stream": [], "on-stream-2": []}
        while not all(c and c[-1].HasField("finish") for c in got.values()):
            for chunk in next(outputs).chunks:
                got[chunk.request_id].append(chunk)
        for chunks in got.values():
            assert [t for c in chunks for t in c.token_ids] == ref["output_ids"]
            assert "".join(c.text for c in chunks) == ref["text"]
        # A whole reply: its first output, then the rest joined (one, if the first was all).
        assert 1 <= len(got["on-stream-2"]) <= 2
        # A streamed one: its outputs in order (a chunk may carry several steps when the
        # reader was behind), the counts cumulative.
        counts = [c.completion_tokens for c in got["on-stream"]]
        assert counts == sorted(set(counts)) and counts[-1] == 12
    finally:
        outputs.cancel()
    # Closed: a request naming it gets its chunks on its own call again.
    deadline = time.monotonic() + 10
    req = _generate_request(ids, "after-close", stream=True, output_stream="s1")
    while True:
        try:
            chunks = [r.chunk for r in stub.Generate(req, metadata=MD)]
        except grpc.RpcError as e:  # it closed as this request went there
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            chunks = []
        if chunks:
            break
        assert time.monotonic() < deadline  # the worker noticed the cancel
    assert [t for c in chunks for t in c.token_ids] == ref["output_ids"]


def test_output_stream_names_are_checked(stub: worker_pb2_grpc.WorkerStub) -> None:
    for name in ("", "x" * 129):
        call = stub.StreamOutputs(worker_pb2.StreamOutputsRequest(stream_id=name), metadata=MD)
        with pytest.raises(grpc.RpcError) as e:
            next(call)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "stream_id" in (e.value.details() or "")


def test_select_picks_the_likeliest_choice(client: Client, engine: Engine) -> None:
    sel = client.select("The capital of France is", [" London", " Paris", " Berlin"])
    assert (sel.index, sel.text) == (1, " Paris")
    ids = engine.tokenizer.encode("The capital of France is")
    conts = [engine.tokenizer.encode(c) for c in (" London", " Paris", " Berlin")]
    ref = asyncio.run(engine.async_score(ids, conts))
    assert sel.sum_logprobs == pytest.approx([sum(r) for r in ref], abs=1e-4)


# ---- cancellation and abort ---------------------------------------------------------------


def test_client_cancellation_frees_kv(client: Client) -> None:
    stream = client.generate("Count to a thousand:", LONG, stream=True)
    assert isinstance(stream, Iterator)
    for _, chunk in zip(range(3), stream, strict=False):
        assert chunk.finish_reason is None
    _wait_running(client, 1)
    stream.close()  # cancels the RPC: the server aborts the request
    _assert_kv_back_to_zero(client)


def test_abort_by_request_id(client: Client) -> None:
    stream = client.generate("Count to a thousand:", LONG, stream=True, request_id="rid-1")
    first = next(iter(stream))
    assert first.request_id == "rid-1"
    assert client.abort("rid-1")
    last = list(stream)[-1]
    assert (last.finish_reason, last.finish_message) == ("abort", "aborted by the client")
    assert not client.abort("rid-1")
    _assert_kv_back_to_zero(client)


# ---- cache events -------------------------------------------------------------------------


def test_cache_events_stream_and_snapshot(client: Client, engine: Engine) -> None:
    stub = client._worker
    events = stub.StreamCacheEvents(worker_pb2.StreamCacheEventsRequest(), metadata=MD)
    first_snap = stub.GetCacheSnapshot(worker_pb2.GetCacheSnapshotRequest(), metadata=MD)
    prompt = "A radix tree shares prefixes between requests. " * 3
    ids = engine.tokenizer.encode(prompt)
    out = client.generate(input_ids=ids, sampling_params={"temperature": 0.0, "max_new_tokens": 4})
    assert isinstance(out, Completion)
    got = [next(events).event]
    snap = stub.GetCacheSnapshot(worker_pb2.GetCacheSnapshotRequest(), metadata=MD)
    while got[-1].sequence < snap.sequence:
        got.append(next(events).event)
    events.cancel()
    assert [e.sequence for e in got] == list(range(first_snap.sequence + 1, snap.sequence + 1))
    assert {e.epoch for e in got} == {snap.epoch} == {first_snap.epoch}
    # The finished request's prompt + output (minus the last token) is in the cache.
    cached = (ids + out.token_ids)[:-1]
    expected = block_hashes(cached, 16)
    stored = {
        h for e in got if e.kind == worker_pb2.CACHE_EVENT_KIND_STORED for h in e.block_hashes
    }
    assert set(expected) <= stored
    in_snapshot = {h for e in snap.events for h in e.block_hashes}
    assert set(expected) <= in_snapshot
    assert snap.block_size == 16
    # The request was announced (its prompt's blocks, pending) before any of it was stored.
    kinds = [e.kind for e in got]
    pending = kinds.index(worker_pb2.CACHE_EVENT_KIND_PENDING)
    assert list(got[pending].block_hashes) == block_hashes(ids, 16)
    assert worker_pb2.CACHE_EVENT_KIND_STORED not in kinds[:pending]
    assert all(e.kind != worker_pb2.CACHE_EVENT_KIND_PENDING for e in snap.events)


def test_a_request_is_announced_started_and_ended_by_its_id(client: Client, engine: Engine) -> None:
    """The events router replicas count each other's requests by (router/pool.py)."""
    stub = client._worker
    events = stub.StreamCacheEvents(worker_pb2.StreamCacheEventsRequest(), metadata=MD, timeout=60)
    stub.GetCacheSnapshot(worker_pb2.GetCacheSnapshotRequest(), metadata=MD)  # subscribed
    ids = engine.tokenizer.encode("Replicas share the load on a worker. " * 3)
    client.generate(input_ids=ids, sampling_params={"temperature": 0.0, "max_new_tokens": 4})
    hashes = block_hashes(ids, 16)
    rid, named = "", []  # (an earlier test's request may end after this one subscribed)
    for resp in events:
        e = resp.event
        if e.kind == worker_pb2.CACHE_EVENT_KIND_PENDING and list(e.block_hashes) == hashes:
            rid = e.request_id
        if rid and e.request_id == rid:
            named.append(e.kind)
            if e.kind == worker_pb2.CACHE_EVENT_KIND_REQUEST_ENDED:
                break
    events.cancel()
    assert rid and named == [
        worker_pb2.CACHE_EVENT_KIND_PENDING,
        worker_pb2.CACHE_EVENT_KIND_REQUEST_STARTED,
        worker_pb2.CACHE_EVENT_KIND_REQUEST_ENDED,
    ]


# ---- errors: one per catalogue status the server produces ---------------------------------


def _raw_error(stub: worker_pb2_grpc.WorkerStub, req: Any, **kw: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Generate(req, metadata=MD, **kw))
    return e.value


_In, _Params, _Ids = common_pb2.Input, common_pb2.SamplingParams, common_pb2.TokenIds
_BAD_MESSAGES = common_pb2.ChatMessages(messages=[common_pb2.ChatMessage(role="x")])


@pytest.mark.parametrize(
    ("inp", "params", "field"),
    [
        (_In(text="hi"), _Params(temperature=-1), "temperature"),
        (_In(text="hi"), _Params(top_k=0), "top_k"),
        (_In(text="hi"), _Params(max_new_tokens=5000), "max_new_tokens"),
        (_In(), _Params(), "input"),
        (_In(text=""), _Params(), "input.text"),
        (_In(token_ids=_Ids()), _Params(), "input.token_ids"),
        (_In(token_ids=_Ids(ids=[49152])), _Params(), "input_ids"),
        (_In(messages=_BAD_MESSAGES), _Params(), "input.messages"),
    ],
)
def test_invalid_argument_names_the_field(
    stub: worker_pb2_grpc.WorkerStub, inp: Any, params: Any, field: str
) -> None:
    err = _raw_error(stub, worker_pb2.GenerateRequest(input=inp, sampling_params=params))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(f"{field}: ")
    assert dict(err.trailing_metadata())["radixmesh-field"] == field


def test_invalid_argument_through_the_sdk(client: Client) -> None:
    with pytest.raises(InvalidArgument) as e:
        client.generate("hi", {"max_new_tokens": 5000})
    assert (e.value.field, e.value.grpc_status) == ("max_new_tokens", "INVALID_ARGUMENT")
    assert "exceeds the context length (4096)" in e.value.message


def test_constraints_map_like_the_engine(client: Client, engine: Engine) -> None:
    """A constraint reaches the engine's validation; its verdict crosses the wire as is."""
    params = {"temperature": 0.0, "max_new_tokens": 8, "regex": "(unclosed"}
    ids = engine.tokenizer.encode("Pick:")
    try:
        engine.generate(input_ids=ids, sampling_params=params)
        expected: type[Exception] | None = None
    except InvalidArgument as e:
        expected, field = type(e), e.field
    if expected is None:
        assert isinstance(client.generate(input_ids=ids, sampling_params=params), Completion)
    else:
        with pytest.raises(expected) as err:
            client.generate(input_ids=ids, sampling_params=params)
        assert err.value.field == field  # type: ignore[attr-defined]


def test_router_rpcs_on_a_worker_are_unimplemented(worker: WorkerProcess) -> None:
    with (
        Client(worker.target, api_key=API_KEY, service="router") as c,
        pytest.raises(Unimplemented),
    ):
        c.model_info()


def test_queue_full_is_resource_exhausted(client: Client) -> None:
    req = worker_pb2.GenerateRequest(
        input=common_pb2.Input(text="Story:"),
        sampling_params=convert.make_params(LONG),
        stream=True,
    )
    calls = [client._worker.Generate(req, metadata=MD) for _ in range(4)]  # start at once
    _until(lambda: client.load().num_in_flight == 4)
    with pytest.raises(Overloaded) as e:
        client.generate("one more", {"max_new_tokens": 1})
    assert e.value.grpc_status == "RESOURCE_EXHAUSTED"
    for call in calls:
        call.cancel()
    _assert_kv_back_to_zero(client)


def test_deadline_exceeded_frees_kv(client: Client) -> None:
    with pytest.raises(DeadlineExceeded):
        client.generate("Count to a thousand:", LONG, timeout=1.0)
    _assert_kv_back_to_zero(client)


def test_missing_api_key_is_unauthenticated(worker: WorkerProcess) -> None:
    with Client(worker.target, service="worker") as c, pytest.raises(Unauthenticated):
        c.generate("hi", {"max_new_tokens": 1})
    with (
        Client(worker.target, api_key="wrong", service="worker") as c,
        pytest.raises(Unauthenticated),
    ):
        c.model_info()


def test_unavailable_target_is_retried_then_raised() -> None:
    port = _free_port()  # nothing listens here
    t0 = time.monotonic()
    # A target that refuses connections is retried for the connect window (10 s by
    # default, to outlast a router's restart), then raised.
    target = f"127.0.0.1:{port}"
    with (
        Client(target, service="worker", max_retries=2, connect_retry_window=1.0) as c,
        pytest.raises(Unavailable),
    ):
        c.generate("hi", {"max_new_tokens": 1})
    assert time.monotonic() - t0 < 5.0


# ---- metrics ------------------------------------------------------------------------------


def _promtool() -> str | None:
    local = ROOT / ".tools" / "bin" / "promtool"
    return str(local) if local.exists() else shutil.which("promtool")


def _scrape(worker: WorkerProcess) -> tuple[str, dict[tuple[str, str], float]]:
    """The exposition text and its samples keyed by (name, labels other than model_name)."""
    url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            assert labels.pop("model_name") == "smollm2", s
            samples[s.name, ",".join(f"{k}={v}" for k, v in sorted(labels.items()))] = s.value
    return text, samples


def test_metrics_scrape_is_promtool_clean(worker: WorkerProcess, client: Client) -> None:
    _wait_idle(client)
    _, before = _scrape(worker)
    out = client.generate("Hello", {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True})
    text, after = _scrape(worker)

    def moved(name: str, labels: str = "") -> float:
        return after[name, labels] - before.get((name, labels), 0.0)

    assert after["radixmesh_num_requests_running", ""] == 0.0
    assert after["radixmesh_num_requests_waiting", ""] == 0.0
    assert 0.0 < after["radixmesh_kv_cache_usage_ratio", ""] <= 1.0
    assert after["radixmesh_kv_cache_capacity_tokens", ""] == 4096
    assert 0 < after["radixmesh_kv_cache_used_tokens", ""] <= 4096
    assert moved("radixmesh_generation_tokens_total") == 4
    assert moved("radixmesh_request_success_total", "finish_reason=length") == 1
    assert moved("radixmesh_request_success_total", "finish_reason=stop") == 0
    assert moved("radixmesh_request_prompt_tokens_count") == 1
    assert moved("radixmesh_request_prompt_tokens_sum") == out.prompt_tokens
    assert moved("radixmesh_request_generation_tokens_sum") == 4
    for phase in ("queue", "prefill", "decode"):
        assert moved(f"radixmesh_request_{phase}_time_seconds_count") == 1
    assert moved("radixmesh_time_to_first_token_seconds_count") == 1
    assert moved("radixmesh_e2e_request_latency_seconds_count") == 1
    assert moved("radixmesh_inter_token_latency_seconds_count") == 3
    # The inter-token buckets start at 1 ms.
    assert ("radixmesh_inter_token_latency_seconds_bucket", "le=0.001") in after
    assert (
        after["radixmesh_prefix_cache_hits_total", ""]
        <= after["radixmesh_prefix_cache_queries_total", ""]
    )
    assert ("radixmesh_num_preemptions_total", "") in after
    assert ("radixmesh_jump_forward_tokens_total", "") in after
    promtool = _promtool()
    assert promtool is not None, "promtool not found (`make tools` installs it)"
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout + check.stderr == ""


# ---- SIGTERM drain (last: it stops the module's worker) ------------------------------------


def test_sigterm_drains(worker: WorkerProcess, client: Client) -> None:
    # Long enough (~5 s on a 2-core CPU) to still be in flight while the checks below run.
    params = {"temperature": 0.0, "max_new_tokens": 64, "ignore_eos": True}
    stream = client.generate("Once upon a time", params, stream=True)
    assert isinstance(stream, Iterator)
    chunks = [next(stream)]
    worker.proc.send_signal(signal.SIGTERM)
    _until(lambda: not client.health("radixmesh.v1.Worker"))
    assert not client.health("")
    with pytest.raises(Unavailable) as e:
        client.generate("new work", {"max_new_tokens": 1})
    assert "draining" in str(e.value)
    chunks += list(stream)  # the request in flight finishes normally
    assert (chunks[-1].finish_reason, chunks[-1].completion_tokens) == ("length", 64)
    assert sum(len(c.token_ids) for c in chunks) == 64
    assert worker.proc.wait(timeout=60) == 0
    assert "radixmesh worker stopped" in worker.logs()


def _until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_worker_cli_help_lists_the_flags() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "radixmesh.cluster.cli", "worker", "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    for flag in ("--model", "--port", "--metrics-port", "--drain-timeout", "--api-key"):
        assert flag in out


def test_the_server_process_loads_no_torch() -> None:
    """The gRPC server's process keeps the engine's modules (and torch) out: the engine
    runs in its child process, and what crosses the pipe unpickles without torch."""
    code = (
        "import sys\n"
        "import radixmesh.worker.server\n"
        "from radixmesh.worker.request_output import RequestOutput\n"
        "heavy = sorted(m for m in ('torch', 'triton', 'transformers', 'radixmesh.worker.engine')"
        " if m in sys.modules)\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
