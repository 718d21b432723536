"""A router replica SIGKILLed with many streams open: do their clients resume with every
token, once? (`radixmesh launch --routers 2`, dummy:tiny workers in deterministic mode, so
a stream's tokens do not depend on the batch it ran in.)

Each prompt's uninterrupted greedy output is generated first. Then `--sdk` streams start
through one SDK connection (all on one replica) and `--sse` OpenAI completions streams
through the shared HTTP port (the kernel spreads them over both replicas; the
X-Radixmesh-Router header says which). Once every stream has its first token, the
replica holding the SDK's connection is SIGKILLed. The SDK resumes on its own; an SSE
client whose stream was cut sends the same request again with its last event's id as
Last-Event-ID. Every stream's text and token count are compared with the reference.

    python -m bench.resumable_streams                  # 40 SDK + 10 SSE streams
    python -m bench.resumable_streams --sdk 50 --sse 0
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from bench import record
from radixmesh.client import Client
from radixmesh.cluster.child import RestartPolicy
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.v1 import router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc

BENCHMARK = "resumable_streams"
FLAGS = {"health_interval": 0.2, "stream_stall_timeout": 5.0, "drain_timeout": 1.0}


@dataclass
class Stream:
    """One client stream's outcome."""

    text: list[str] = field(default_factory=list)
    tokens: int = 0  # completion tokens received
    started: threading.Event = field(default_factory=threading.Event)
    cut: bool = False  # its router died under it
    gap: float | None = None  # seconds from the kill to its first output after it
    error: str | None = None


def prompt(i: int) -> list[int]:
    return [3 + (11 * i + 7 * j) % 500 for j in range(20)]


def sdk_stream(
    client: Client, i: int, params: dict[str, Any], s: Stream, killed: list[float]
) -> None:
    try:
        for chunk in client.generate(input_ids=prompt(i), sampling_params=params, stream=True):
            if killed and s.gap is None:
                s.gap = time.monotonic() - killed[0]
            s.text.append(chunk.text)
            s.tokens += len(chunk.token_ids)
            if chunk.token_ids:
                s.started.set()
    except Exception as e:
        s.error = f"{type(e).__name__}: {e}"
        s.started.set()


def _post(port: int, body: dict[str, Any], last_id: str | None) -> tuple[Any, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    return conn, conn.getresponse()


def sse_stream(
    port: int, i: int, params: dict[str, Any], s: Stream, killed: list[float], routers: list[str]
) -> None:
    body = {"model": "dummy:tiny", "prompt": prompt(i), "stream": True, "temperature": 0}
    body |= {"max_tokens": params["max_new_tokens"], "ignore_eos": True}
    body |= {"stream_options": {"include_usage": True}}
    last_id: str | None = None
    try:
        for _ in range(20):  # a resume refused while the cluster settles is sent again
            try:
                conn, resp = _post(port, body, last_id)
            except (ConnectionError, http.client.HTTPException):
                time.sleep(0.2)  # a connection the dying replica had accepted: again
                continue
            if resp.status != 200:
                resp.read()
                conn.close()
                time.sleep(0.2)
                continue
            routers.append(resp.getheader("X-Radixmesh-Router", ""))
            done, last_id = _read_events(resp, s, killed, last_id)
            conn.close()
            if done:
                return
            s.cut = True
        s.error = "gave up resuming"
    except Exception as e:
        s.error = f"{type(e).__name__}: {e}"
    finally:
        s.started.set()


def _read_events(
    resp: Any, s: Stream, killed: list[float], last_id: str | None
) -> tuple[bool, str | None]:
    """Read an SSE body into `s` until [DONE] (True) or a cut (False); the last id."""
    data: str | None = None
    event_id: str | None = None
    while True:
        try:
            line = resp.readline()
        except (http.client.IncompleteRead, ConnectionError):
            return False, last_id
        if not line:
            return False, last_id
        text = line.decode().rstrip("\n")
        if text.startswith("data: "):
            data = text[6:]
        elif text.startswith("id: "):
            event_id = text[4:]
        elif not text and data is not None:
            if data == "[DONE]":
                return True, last_id
            payload = json.loads(data)
            if "error" in payload:
                return False, last_id
            if payload["choices"]:
                if killed and s.gap is None:
                    s.gap = time.monotonic() - killed[0]
                s.text.append(payload["choices"][0]["text"])
                s.started.set()
            if payload.get("usage"):
                s.tokens = payload["usage"]["completion_tokens"]
            last_id = event_id or last_id
            data, event_id = None, None


def idle_worker_kv(cluster: LocalCluster) -> list[int]:
    """Each worker's KV tokens in use once nothing runs there and its cache is flushed."""
    md = (("authorization", f"Bearer {cluster.worker_key}"),)
    used = []
    for address in cluster.worker_addresses:
        with grpc.insecure_channel(address) as ch:
            stub = worker_pb2_grpc.WorkerStub(ch)
            deadline = time.monotonic() + 60
            while stub.GetLoad(worker_pb2.GetLoadRequest(), metadata=md).num_in_flight:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            stub.FlushCache(worker_pb2.FlushCacheRequest(), metadata=md)
            used.append(stub.GetLoad(worker_pb2.GetLoadRequest(), metadata=md).kv_tokens_used)
    return used


def run(args: argparse.Namespace) -> dict[str, Any]:
    params = {"max_new_tokens": args.tokens, "temperature": 0.0, "ignore_eos": True}
    http_port = free_port()
    spec = LaunchSpec(
        model=args.model,
        workers=args.workers,
        routers=2,
        port=free_port(),
        worker_args=("--dtype", "float32", "--deterministic", "--resume-grace", str(args.grace)),
        router_options={**FLAGS, "http_port": http_port},
        ready_timeout=300.0,
        restart=RestartPolicy(max_restarts=3, restart_backoff=0.2),
    )
    n = args.sdk + args.sse
    with LocalCluster(spec) as cluster:
        stop = threading.Event()

        def tend() -> None:
            while not stop.wait(0.2):
                cluster.failure()

        threading.Thread(target=tend, daemon=True).start()
        with Client(cluster.address, timeout=300, connections=4) as ref_client:
            refs: list[Any] = [None] * n
            pool = [
                threading.Thread(
                    target=lambda i=i: refs.__setitem__(
                        i, ref_client.generate(input_ids=prompt(i), sampling_params=params)
                    )
                )
                for i in range(n)
            ]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        streams = [Stream() for _ in range(n)]
        killed: list[float] = []
        routers: list[str] = []
        client = Client(cluster.address, timeout=300)
        (channel,) = client._channels.channels()
        status = router_pb2_grpc.RouterStub(channel).ClusterStatus(
            router_pb2.ClusterStatusRequest(), timeout=10
        )
        victim = status.router_id
        threads = [
            threading.Thread(target=sdk_stream, args=(client, i, params, streams[i], killed))
            for i in range(args.sdk)
        ]
        threads += [
            threading.Thread(
                target=sse_stream, args=(http_port, i, params, streams[i], killed, routers)
            )
            for i in range(args.sdk, n)
        ]
        for t in threads:
            t.start()
        for s in streams:
            s.started.wait(300)
        killed.append(time.monotonic())
        os.kill(int(victim.rsplit(":", 1)[1]), signal.SIGKILL)
        for t in threads:
            t.join(600)
        client.close()
        stop.set()
        kv_after = idle_worker_kv(cluster)
    for i in range(args.sdk):
        streams[i].cut = True  # every SDK stream was on the victim's connection
    exact = [("".join(s.text) == refs[i].text) for i, s in enumerate(streams)]
    expected = sum(len(r.token_ids) for r in refs)
    received = sum(s.tokens for s in streams)
    gaps = [s.gap for s in streams if s.cut and s.gap is not None]
    return {
        "model": args.model,
        "workers": args.workers,
        "streams": {"sdk": args.sdk, "sse": args.sse},
        "tokens_per_stream": args.tokens,
        "cut_streams": {
            "sdk": sum(s.cut for s in streams[: args.sdk]),
            "sse": sum(s.cut for s in streams[args.sdk :]),
        },
        "tokens_expected": expected,
        "tokens_received": received,
        "tokens_lost": expected - received,
        "texts_exact": sum(exact),
        "errors": [s.error for s in streams if s.error],
        "resume_gap_s": {
            "p50": round(statistics.median(gaps), 3) if gaps else None,
            "max": round(max(gaps), 3) if gaps else None,
        },
        "worker_kv_tokens_used_after": kv_after,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="dummy:tiny")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sdk", type=int, default=40, help="SDK streams (all on the victim)")
    ap.add_argument("--sse", type=int, default=10, help="SSE streams (either replica)")
    ap.add_argument("--tokens", type=int, default=256, help="new tokens per stream")
    ap.add_argument("--grace", type=float, default=30.0, help="the workers' --resume-grace")
    record.add_output_arguments(ap)
    args = ap.parse_args()
    figures = run(args)
    rows = [
        ("streams (SDK + SSE)", f"{args.sdk} + {args.sse}"),
        ("cut by the kill (SDK + SSE)", "{sdk} + {sse}".format(**figures["cut_streams"])),
        ("tokens expected", figures["tokens_expected"]),
        ("tokens received", figures["tokens_received"]),
        ("tokens lost", figures["tokens_lost"]),
        ("texts equal to the reference", f"{figures['texts_exact']} / {args.sdk + args.sse}"),
        ("errors", len(figures["errors"])),
        ("resume gap p50 / max (s)", "{p50} / {max}".format(**figures["resume_gap_s"])),
        ("worker KV tokens in use after", figures["worker_kv_tokens_used_after"]),
    ]
    for name, value in rows:
        print(f"{name:<32} {value}")
    record.write(BENCHMARK, args, figures)


if __name__ == "__main__":
    main()
