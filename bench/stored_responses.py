"""What keeping the Responses API's stored responses on the workers costs the router.

Every replica reaches stored responses through the worker that holds them
(router/http/openai/responses_api/worker_store.py): a put after each stored response, a
get per `previous_response_id`, retrieve or input-items page, a delete per DELETE. This
measures those calls against the in-memory store they replaced, for conversations of
`--sizes` bytes of text: one real worker gRPC server (its servicer's store, no model) on
loopback and a router's worker pool, in one process; `--ops` calls of each kind per size,
one at a time. Reported: median and 99th percentile milliseconds per call.

    python -m bench.stored_responses --sizes 1024,65536,1048576 --ops 200
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import grpc

from bench import record
from radixmesh.router.config import RouterConfig
from radixmesh.router.http.openai.responses_api.store import (
    MemoryResponseStore,
    ResponseStore,
    StoredResponse,
)
from radixmesh.router.http.openai.responses_api.worker_store import WorkerResponseStore
from radixmesh.router.pool import WorkerPool
from radixmesh.v1 import worker_pb2_grpc
from radixmesh.worker.server import ServerConfig, WorkerServicer

EPOCH = 0x5EED  # the worker's epoch as the pool's summary of it says


def entry(store: ResponseStore, size: int, i: int) -> StoredResponse:
    """A conversation of `size` bytes of text: one input message, one output message."""
    text = "x" * (size // 2)
    message: dict[str, Any] = {"type": "message", "role": "user", "id": f"in_{i}"}
    message["content"] = [{"type": "input_text", "text": text}]
    output: dict[str, Any] = {"type": "message", "role": "assistant", "id": f"msg_{i}"}
    output["content"] = [{"type": "output_text", "text": text}]
    response = {"id": store.new_id("worker-0"), "object": "response", "output": [output]}
    return StoredResponse(response, (message,))


async def timed(call: Any) -> tuple[float, Any]:
    """Milliseconds of one awaitable, and its result."""
    start = time.perf_counter()
    result = await call
    return (time.perf_counter() - start) * 1000, result


def summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
    }


async def measure(store: ResponseStore, size: int, ops: int) -> dict[str, dict[str, float]]:
    """Each entry put, read back and deleted in turn (one entry held at a time, so that
    no bound drops one)."""
    ms: dict[str, list[float]] = {"put": [], "get": [], "delete": []}
    for i in range(ops):
        e = entry(store, size, i)
        put_ms, stored = await timed(store.put("c", e))
        get_ms, got = await timed(store.get("c", e.id))
        delete_ms, deleted = await timed(store.delete("c", e.id))
        assert (stored, got, deleted) == (True, e, True)
        ms["put"].append(put_ms)
        ms["get"].append(get_ms)
        ms["delete"].append(delete_ms)
    return {kind: summary(values) for kind, values in ms.items()}


async def run(sizes: list[int], ops: int) -> list[dict[str, Any]]:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(ServerConfig()), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pool = WorkerPool(RouterConfig(workers=(f"127.0.0.1:{port}",)))
    pool.workers["worker-0"].summary.epoch = EPOCH
    rows = []
    try:
        for size in sizes:
            stores: dict[str, ResponseStore] = {
                "memory": MemoryResponseStore(65536, 1 << 30, 3600.0),
                "worker": WorkerResponseStore(pool, 3600.0, 64 << 20),
            }
            for name, store in stores.items():
                await measure(store, size, min(ops, 20))  # warm up (channel, allocator)
                rows.append({"store": name, "bytes": size, **await measure(store, size, ops)})
    finally:
        await pool.close()
        await server.stop(None)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes", default="1024,65536,1048576", help="conversation bytes, comma-separated"
    )
    ap.add_argument("--ops", type=int, default=200, help="calls of each kind per size and store")
    record.add_output_arguments(ap)
    args = ap.parse_args()
    rows = asyncio.run(run([int(s) for s in args.sizes.split(",")], args.ops))
    print(
        f"{'store':8} {'bytes':>8}  {'put p50/p99 ms':>16}  {'get p50/p99 ms':>16}  "
        f"{'delete p50/p99 ms':>18}"
    )
    for r in rows:
        cells = [f"{r[k]['p50_ms']:.3f}/{r[k]['p99_ms']:.3f}" for k in ("put", "get", "delete")]
        print(f"{r['store']:8} {r['bytes']:>8}  {cells[0]:>16}  {cells[1]:>16}  {cells[2]:>18}")
    record.write("stored_responses", args, {"rows": rows})


if __name__ == "__main__":
    main()
