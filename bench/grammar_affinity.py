"""Grammar affinity: how often each JSON schema is compiled when its requests go through a
cache_aware router with grammar affinity and without (`--grammar-affinity-tokens 0`).

One launched cluster of 4 dummy:tiny workers. Each run sends `--rounds` rounds of one
request per schema (8 schemas), one request at a time, every prompt cold (its first
bytes differ from every other prompt's, so no worker caches any of it): cache_aware sees
tied workers for every request. After each request the run waits until the router has
heard every compile the workers report, so no request is routed before its schema's
compile is known, and the counts do not depend on timing. The two runs use different
schemas (a worker keeps what it compiled), and each schema's compiles are counted from
the workers' snapshots (the grammar keys each one holds; nothing is evicted at 16 of the
1,024 grammars a worker's compile cache keeps).

    python -m bench.grammar_affinity                  # 4 rounds
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from collections.abc import Sequence

import grpc
from prometheus_client.parser import text_string_to_metric_families

from bench import record
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.grammar_key import grammar_key
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc

BENCHMARK = "grammar_affinity"
WORKERS = 4
SCHEMAS = 8
WORKER_KEY = "bench-worker-key"
WORKER_MD = (("authorization", f"Bearer {WORKER_KEY}"),)
# Seeded: the router's random tie-breaks (the first request of each schema) repeat.
ROUTER_OPTIONS = {"seed": 0}


def schemas(run: str, n: int = SCHEMAS) -> list[str]:
    """`n` distinct small JSON schemas, named by `run` (runs on one cluster differ)."""
    return [
        json.dumps(
            {
                "type": "object",
                "properties": {f"{run}_field_{i}": {"type": "integer"}},
                "required": [f"{run}_field_{i}"],
            }
        )
        for i in range(n)
    ]


def launch(metrics_port: int) -> LocalCluster:
    return LocalCluster(
        LaunchSpec(
            model="dummy:tiny",
            workers=WORKERS,
            port=free_port(),
            worker_args=("--dtype", "float32", "--grammar-compile-processes", "1"),
            router_options={**ROUTER_OPTIONS, "metrics_port": metrics_port},
            ready_timeout=180.0,
            worker_api_key=WORKER_KEY,
        )
    )


def worker_grammars(stub: worker_pb2_grpc.WorkerStub) -> set[int]:
    """The grammar keys a worker's cache snapshot holds."""
    request = worker_pb2.GetCacheSnapshotRequest()
    snap = stub.GetCacheSnapshot(request, metadata=WORKER_MD, timeout=30)
    keys: set[int] = set()
    for ev in snap.events:
        if ev.kind == worker_pb2.CACHE_EVENT_KIND_GRAMMAR_COMPILED:
            keys.update(ev.grammar_keys)
    return keys


def router_grammars(metrics_url: str) -> int:
    """The grammars the router knows its workers hold, over all of them."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return int(
        sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "radixmesh_router_worker_grammars"
        )
    )


def _settle(
    metrics_url: str, workers: Sequence[worker_pb2_grpc.WorkerStub], timeout: float = 30.0
) -> None:
    """Wait until the router has heard of every grammar the workers hold."""
    deadline = time.monotonic() + timeout
    while True:
        held = sum(len(worker_grammars(w)) for w in workers)
        known = router_grammars(metrics_url)
        if known == held:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the router knows of {known} of the {held} grammars held")
        time.sleep(0.02)


def run(
    router: str, metrics_url: str, worker_addresses: Sequence[str], run_name: str, rounds: int
) -> dict[str, object]:
    """`rounds` rounds of one request per schema, one at a time; each schema's compiles
    (workers holding it) and the workers its requests went to."""
    texts = schemas(run_name)
    placed: dict[int, list[str]] = {i: [] for i in range(len(texts))}
    channels = [grpc.insecure_channel(a) for a in [router, *worker_addresses]]
    try:
        stub = router_pb2_grpc.RouterStub(channels[0])
        workers = [worker_pb2_grpc.WorkerStub(ch) for ch in channels[1:]]
        n = 0
        for _ in range(rounds):
            for i, schema in enumerate(texts):
                # A prompt no other prompt shares a block with: every worker ties on it.
                prompt = f"{run_name}{n:04d} Fill in record {n} for schema {i} as JSON: "
                params = common_pb2.SamplingParams(
                    max_new_tokens=8, temperature=0.0, json_schema=schema
                )
                req = router_pb2.RouterGenerateRequest(
                    input=common_pb2.Input(text=prompt), sampling_params=params
                )
                (resp,) = list(stub.Generate(req, timeout=120))
                placed[i].append(resp.worker_id)
                _settle(metrics_url, workers)
                n += 1
        held = [worker_grammars(w) for w in workers]
    finally:
        for ch in channels:
            ch.close()
    compiles = [
        sum(grammar_key("json_schema", schema) in keys for keys in held) for schema in texts
    ]
    return {"compiles_per_schema": compiles, "workers_per_schema": placed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=4, help="requests per schema")
    record.add_output_arguments(ap)
    args = ap.parse_args()
    metrics_port, off_metrics_port = free_port(), free_port()
    with launch(metrics_port) as cluster:
        workers = cluster.worker_addresses
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        on = run(cluster.address, url, workers, "on", args.rounds)
        off = run_without_affinity(cluster, off_metrics_port, args.rounds)
    figures = {
        "workers": WORKERS,
        "schemas": SCHEMAS,
        "requests_per_schema": args.rounds,
        "with_affinity": on,
        "without_affinity": off,
    }
    for name, result in (("with", on), ("without", off)):
        print(f"{name} affinity: compiles per schema {result['compiles_per_schema']}")
    record.write(BENCHMARK, args, figures, name=None)


def run_without_affinity(
    cluster: LocalCluster, metrics_port: int, rounds: int
) -> dict[str, object]:
    """The same workload through a second router with grammar affinity off."""
    from tests.router.routers import ExtraRouter

    flags = ["--grammar-affinity-tokens", "0", "--metrics-port", str(metrics_port)]
    flags += ["--health-interval", "1", "--seed", "0"]
    with ExtraRouter(cluster, *flags) as off:
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        return run(off.address, url, cluster.worker_addresses, "off", rounds)


if __name__ == "__main__":
    main()
