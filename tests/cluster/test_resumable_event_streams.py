"""Resumable Anthropic Messages, Responses API and chat-with-logprobs streams: the router
replica serving one is SIGKILLed mid-stream, and the client reconnects with its last
event's id as Last-Event-ID (to the same HTTP port: the other replica, or the killed one
restarted). The events before the cut and those of the resume are one well-formed stream
of the API's own events (each parses as the `anthropic` / `openai` package's event type),
with no event twice, and its text equals the uninterrupted reply's exactly (greedy, a
deterministic dummy:tiny worker: tests/cluster/test_resumable_streams.py's cluster).
"""

# ruff: noqa: F811 (the tests take the imported `cluster` fixture as their argument)
from __future__ import annotations

import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import grpc
import openai
import pydantic
import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.responses import ResponseStreamEvent

from radixmesh.client import Chunk, Client
from radixmesh.cluster.launch import LocalCluster
from radixmesh.errors import Unavailable
from radixmesh.v1 import router_pb2, router_pb2_grpc
from tests.cluster.sse import Event, read_events
from tests.cluster.test_resumable_streams import (  # noqa: F401 (the fixture)
    PARAMS,
    PROMPTS,
    _both_replicas,
    _idle_worker,
    _pid_of,
    cluster,
)

pytestmark = pytest.mark.slow

MODEL = "dummy:tiny"
KEY = "unused"  # the cluster has no keys: a caller is known by its key all the same
MAX_TOKENS = 512  # long enough that the stream is still generating when its router dies


def _both_up(cluster: LocalCluster) -> None:
    """Both replicas serve (a killed one restarted), asked again while a connection
    reaches the killed replica's socket before the kernel has closed it."""
    for _ in range(100):
        try:
            return _both_replicas(cluster)
        except grpc.RpcError:
            time.sleep(0.1)
    raise AssertionError("the replicas did not come back")


def _reaped(pid: int) -> bool:
    """Whether the process `pid` is gone, reaped by its launcher (the cluster's tender
    polls it). Not merely a zombie: a multithreaded process's main thread shows as one
    while its other threads still exit, holding its descriptors (its listening socket),
    and a thread group is reaped only once its last thread has closed them."""
    return not Path(f"/proc/{pid}").exists()


def _port(cluster: LocalCluster) -> int:
    return int(cluster.config.router_options["http_port"])


def _post(
    port: int, path: str, body: dict[str, Any], last_event_id: str | None = None
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    # The SDK clients' key: a stream is its caller's alone (stored responses too).
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    conn.request("POST", path, json.dumps(body), headers)
    return conn, conn.getresponse()


def _reconnect(port: int, path: str, body: dict[str, Any], last_id: str) -> list[Event]:
    """The resume's events, sent again (as an SSE client reconnects) while a connection
    reaches the killed replica's socket before the kernel has closed it."""
    for _ in range(50):
        try:
            conn, resp = _post(port, path, body, last_id)
        except ConnectionError:
            time.sleep(0.1)
            continue
        assert resp.status == 200, resp.read()
        try:
            return read_events(resp)
        finally:
            conn.close()
    raise AssertionError("no replica took the resume")


def _cut_and_resume(cluster: LocalCluster, path: str, body: dict[str, Any]) -> list[Event]:
    """A stream whose replica is SIGKILLed after its first events, resumed: every event
    the client got, in order."""
    _both_up(cluster)
    port = _port(cluster)
    conn, resp = _post(port, path, body)
    assert resp.status == 200, resp.read()
    victim = _pid_of(resp.getheader("X-Radixmesh-Router") or "")
    before = read_events(resp, until=4)
    os.kill(victim, signal.SIGKILL)
    before += read_events(resp)  # what was on its way, then the cut
    conn.close()
    last_id = before[-1][0]
    assert last_id is not None
    events = before + _reconnect(port, path, body, last_id)
    ids = [event_id for event_id, _, _ in events if event_id is not None]
    assert len(set(ids)) == len(ids)  # none twice
    return events


@pytest.fixture(scope="module")
def clients(cluster: LocalCluster) -> Iterator[tuple[anthropic.Anthropic, openai.OpenAI]]:
    url = f"http://127.0.0.1:{_port(cluster)}"
    claude = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=3)
    gpt = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=3)
    yield claude, gpt
    claude.close()
    gpt.close()


def test_an_anthropic_stream_resumes_after_its_last_event(
    cluster: LocalCluster, clients: tuple[anthropic.Anthropic, openai.OpenAI]
) -> None:
    claude, _ = clients
    _both_up(cluster)
    messages: Any = [{"role": "user", "content": "Tell me a long story about routers."}]
    body: dict[str, Any] = {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": messages}
    greedy = {"temperature": 0}  # Anthropic's newer clients no longer declare it
    whole = claude.messages.create(**body, extra_body=greedy)
    assert whole.stop_reason == "max_tokens"
    with claude.messages.stream(**body, extra_body=greedy) as uncut:  # uninterrupted
        assert [b.text for b in uncut.get_final_message().content] == [whole.content[0].text]  # type: ignore[union-attr]
    events = _cut_and_resume(cluster, "/v1/messages", body | greedy | {"stream": True})
    assert all(event_id for event_id, _, _ in events)
    assert [name for _, name, _ in events].count("ping") == 1
    events = [e for e in events if e[1] != "ping"]  # not among the SDK's types: it skips it
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
    parsed = [adapter.validate_json(data) for _, _, data in events]
    assert [name for _, name, _ in events] == [p.type for p in parsed]
    kinds = [p.type for p in parsed]
    assert kinds.count("message_start") == 1 and kinds[0] == "message_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(p.delta.text for p in parsed if p.type == "content_block_delta")
    assert [b.type for b in whole.content] == ["text"]
    assert text == whole.content[0].text
    assert parsed[-2].usage.output_tokens == MAX_TOKENS == whole.usage.output_tokens
    assert parsed[-2].delta.stop_reason == "max_tokens"
    assert _idle_worker(cluster).kv_tokens_used == 0


def test_a_responses_stream_resumes_and_is_stored_by_the_replica_that_ends_it(
    cluster: LocalCluster, clients: tuple[anthropic.Anthropic, openai.OpenAI]
) -> None:
    _, gpt = clients
    _both_up(cluster)
    body: dict[str, Any] = {
        "model": MODEL,
        "input": "Tell me a long story about replicas.",
        "max_output_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    whole = gpt.responses.create(**body)
    assert whole.status == "incomplete"
    events = _cut_and_resume(cluster, "/v1/responses", body | {"stream": True})
    assert all(event_id for event_id, _, _ in events)
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
    parsed = [adapter.validate_json(data) for _, _, data in events]
    assert [name for _, name, _ in events] == [p.type for p in parsed]
    assert [p.sequence_number for p in parsed] == list(range(len(parsed)))
    kinds = [p.type for p in parsed]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.incomplete"
    text = "".join(p.delta for p in parsed if p.type == "response.output_text.delta")
    assert text == whole.output_text
    done = [p.text for p in parsed if p.type == "response.output_text.done"]
    assert done == [whole.output_text]
    created, final = parsed[0].response, parsed[-1].response
    assert (final.id, final.created_at) == (created.id, created.created_at)
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens == MAX_TOKENS
    added = [p.item.id for p in parsed if p.type == "response.output_item.added"]
    assert [item.id for item in final.output] == added
    # Stored by the replica that finished it, under the id the stream began with (once
    # the stream's end is written: the client may ask first).
    stored = _retrieved(gpt, final.id)
    assert stored.output_text == whole.output_text and stored.status == "incomplete"
    assert _idle_worker(cluster).kv_tokens_used == 0


def _retrieved(gpt: openai.OpenAI, response_id: str) -> Any:
    for _ in range(100):
        try:
            return gpt.responses.retrieve(response_id)
        except openai.NotFoundError:
            time.sleep(0.05)
    raise AssertionError(f"{response_id} was not stored")


def test_a_chat_stream_with_logprobs_resumes(
    cluster: LocalCluster, clients: tuple[anthropic.Anthropic, openai.OpenAI]
) -> None:
    _, gpt = clients
    _both_up(cluster)
    messages: Any = [{"role": "user", "content": "Count the replicas."}]
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS}
    body["temperature"] = 0
    body |= {"logprobs": True, "top_logprobs": 2}
    whole = gpt.chat.completions.create(**body, extra_body={"ignore_eos": True})
    (choice,) = whole.choices
    assert choice.logprobs is not None and choice.logprobs.content is not None
    events = _cut_and_resume(
        cluster, "/v1/chat/completions", body | {"stream": True, "ignore_eos": True}
    )
    assert events[-1] == (None, None, "[DONE]")
    assert all(event_id for event_id, _, _ in events[1:-1])  # all but the role's and [DONE]
    chunks = [json.loads(data) for _, _, data in events[:-1]]
    deltas = [c["choices"][0] for c in chunks]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == choice.message.content
    tokens = [t for d in deltas if d["logprobs"] for t in d["logprobs"]["content"]]
    assert tokens == [t.model_dump() for t in choice.logprobs.content]
    assert deltas[-1]["finish_reason"] == "length"


def test_a_chat_stream_with_tools_resumes_by_a_replay(
    cluster: LocalCluster, clients: tuple[anthropic.Anthropic, openai.OpenAI]
) -> None:
    """Tools to parse: its events have the replay's ids (event_ids.py); the chunks keep
    their id and `created` across the resume."""
    _, gpt = clients
    _both_up(cluster)
    messages: Any = [{"role": "user", "content": "Check the replicas."}]
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": tools}
    body |= {"max_tokens": MAX_TOKENS, "temperature": 0}
    whole = gpt.chat.completions.create(**body, extra_body={"ignore_eos": True})
    (choice,) = whole.choices
    events = _cut_and_resume(
        cluster, "/v1/chat/completions", body | {"stream": True, "ignore_eos": True}
    )
    assert events[-1] == (None, None, "[DONE]")
    assert all(event_id and event_id.count("/") == 5 for event_id, _, _ in events[:-1])
    chunks = [json.loads(data) for _, _, data in events[:-1]]
    assert len({(c["id"], c["created"]) for c in chunks}) == 1
    deltas = [c["choices"][0] for c in chunks]
    assert [d["delta"].get("role") for d in deltas].count("assistant") == 1
    assert "".join(d["delta"].get("content") or "" for d in deltas) == choice.message.content
    assert [d["finish_reason"] for d in deltas][-1] == choice.finish_reason == "length"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            {
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            },
        ),
        ("/v1/responses", {"input": "hi", "top_logprobs": 2}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "logprobs": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2}),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "logprobs": True,
            },
        ),
    ],
)
def test_streams_that_cannot_resume_refuse_a_last_event_id(
    cluster: LocalCluster, path: str, body: dict[str, Any]
) -> None:
    conn, resp = _post(_port(cluster), path, body | {"model": MODEL, "stream": True}, "x/1")
    reply = json.loads(resp.read())
    conn.close()
    assert resp.status == 400, reply
    assert "Last-Event-ID" in json.dumps(reply)
    assert "resumes" in json.dumps(reply)


def test_an_sdk_stream_not_resumed_raises_unavailable_saying_where_to_resume(
    cluster: LocalCluster,
) -> None:
    """A client that may not retry (max_retries=0) sees its router's SIGKILL as the SDK's
    Unavailable naming the stream and offset, not as the transport's error; a resume by
    hand from there ends the text as an uninterrupted run does."""
    _both_up(cluster)
    with Client(cluster.address, timeout=60) as client:
        whole = client.generate(input_ids=PROMPTS[2], sampling_params=PARAMS)
    got: list[Chunk] = []
    client = Client(cluster.address, timeout=60, max_retries=0)
    try:
        (channel,) = client._channels.channels()
        status = router_pb2_grpc.RouterStub(channel).ClusterStatus(
            router_pb2.ClusterStatusRequest(), timeout=10
        )
        victim = _pid_of(status.router_id)
        with pytest.raises(Unavailable) as e:
            for chunk in client.generate(input_ids=PROMPTS[2], sampling_params=PARAMS, stream=True):
                got.append(chunk)
                if len(got) == 3:
                    os.kill(victim, signal.SIGKILL)
    finally:
        client.close()
    assert not isinstance(e.value, grpc.RpcError)
    stream_id, offset = got[-1].stream_id, got[-1].offset
    assert f"the stream {stream_id!r} broke after {offset} tokens" in str(e.value)
    assert f"resume({stream_id!r}, {offset})" in str(e.value)
    # The client sees its stream break while the killed replica is still exiting: until
    # the kernel has closed that process's listening socket, a new connection to the
    # shared port can land in its backlog and be reset, and on a loaded machine that
    # outlasts the SDK's few retries (gRPC also fails calls at once for a second after a
    # failed connect). Resume once it is gone: the port then leads only to replicas that
    # serve (a restarted one listens only once serving).
    deadline = time.monotonic() + 60
    while not _reaped(victim):
        assert time.monotonic() < deadline, "the killed replica did not exit"
        time.sleep(0.05)
    with Client(cluster.address, timeout=60) as again:
        got += list(again.resume(stream_id, offset))
    assert "".join(c.text for c in got) == whole.text
    assert [t for c in got for t in c.token_ids] == whole.token_ids
    assert _idle_worker(cluster).kv_tokens_used == 0
