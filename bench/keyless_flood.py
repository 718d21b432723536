"""The keyless flood: thousands of connections that never authenticate against a keyed
cluster's router (gRPC, then HTTP) and a worker, and what clients with a key see meanwhile.

Starts a local cluster with an API key (its workers always take one) and, beside it, a
router without keys in front of the same workers. Then:

1. `throughput`: the router's gRPC throughput with the gate (the keyed router, its public
   port spliced to grpc-core by gate.py) and without (the router without keys), in
   alternating rounds: `--clients` concurrent generate calls of `--tokens` tokens.
2. Three floods of `--connections` keyless connections for `--hold` seconds each, spread
   over source addresses 127.0.0.2-127.0.0.N (`--per-address` each; the cluster's own
   connections and the gRPC clients come from 127.0.0.1):
   - `grpc`: the router's gRPC port; each connection finishes the HTTP/2 handshake (and
     answers SETTINGS and PINGs) and sends one call without a key every `--every` s;
   - `http`: the router's HTTP port; `GET /v1/models` without a key every `--every` s
     over HTTP/1.1 keep-alive;
   - `worker`: worker 0's port, as `grpc`; meanwhile a new router (keyed) starts in
     front of the workers, as after a restart, and must reach every worker.
   A connection the server closes is opened again after `--reconnect-delay` s. Meanwhile,
   every 0.5 s, a client with the key makes a completion over a new HTTP connection and a
   generate call over a new gRPC channel (from an address of its own), and ClusterStatus
   (admin key) says whether the router sees every worker healthy.
3. RSS of the router and the workers: before, at the peak of each flood, and
   `--settle` s after the last one.

    python -m bench.keyless_flood --connections 9000 --hold 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from bench import record

KEY, ADMIN = "flood-key", "flood-admin"
NORMAL_ADDRESS = "127.0.0.254"
GET_LOAD = b"/radixmesh.v1.Worker/GetLoad"
GENERATE = b"/radixmesh.v1.Router/Generate"


# ---- raw HTTP/2 ------------------------------------------------------------------------------


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload
    )


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing (no state: the same bytes each call)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def keyless_call(path: bytes, stream: int) -> bytes:
    """A gRPC call without a key on `stream`: HEADERS, then an empty message, ending it."""
    block = b"".join(
        _literal(n, v)
        for n, v in (
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
            (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
        )
    )  # fmt: skip
    return _frame(1, 0x4, stream, block) + _frame(0, 0x1, stream, b"\x00" * 5)


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0)


class H2Reader:
    """Reads a server's frames: answers SETTINGS and PING, notes GOAWAY."""

    def __init__(self) -> None:
        self.buf = b""
        self.goaway = False

    def feed(self, data: bytes) -> bytes:
        """What to send back for `data`."""
        self.buf += data
        out = b""
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + n:
                break
            kind, flags, payload = self.buf[3], self.buf[4], self.buf[9 : 9 + n]
            self.buf = self.buf[9 + n :]
            if kind == 4 and not flags & 1:
                out += _frame(4, 1, 0)
            elif kind == 6 and not flags & 1:
                out += _frame(6, 1, 0, payload)
            elif kind == 7:
                self.goaway = True
        return out


# ---- the flood -------------------------------------------------------------------------------


class Flood:
    """`--connections` keyless connections of one kind, kept open (reopened when closed)."""

    def __init__(self, args: argparse.Namespace, kind: str, port: int, path: bytes) -> None:
        self.args, self.kind, self.port, self.path = args, kind, port, path
        self.events: Counter[str] = Counter()
        self.open = 0
        self.peak = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        n = self.args.connections
        tasks = [asyncio.create_task(self.hold(i)) for i in range(n)]
        await self.stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def hold(self, i: int) -> None:
        source = f"127.0.0.{2 + i // self.args.per_address}"  # 127.0.0.1: the cluster's own
        await asyncio.sleep(i / self.args.ramp)
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, local_addr=(source, 0)
                )
            except OSError:
                self.events["connect failed"] += 1
                await asyncio.sleep(self.args.reconnect_delay)
                continue
            self.open += 1
            self.peak = max(self.peak, self.open)
            self.events["opened"] += 1
            try:
                talk = self.talk_h2 if self.kind != "http" else self.talk_http
                self.events[await talk(reader, writer)] += 1
            except (OSError, asyncio.IncompleteReadError):
                self.events["closed (reset)"] += 1
            finally:
                self.open -= 1
                writer.close()
            await asyncio.sleep(self.args.reconnect_delay)

    async def talk_h2(self, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> str:
        h2, stream = H2Reader(), 1
        w.write(PREFACE + keyless_call(self.path, stream))
        next_call = time.monotonic() + self.args.every
        while True:
            try:
                wait = max(0.0, next_call - time.monotonic())
                data = await asyncio.wait_for(reader.read(65536), wait)
            except TimeoutError:
                stream += 2
                w.write(keyless_call(self.path, stream))
                self.events["calls"] += 1
                next_call += self.args.every
                continue
            if not data:
                return "closed (GOAWAY)" if h2.goaway else "closed"
            if out := h2.feed(data):
                w.write(out)

    async def talk_http(self, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> str:
        while True:
            w.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            self.events["calls"] += 1
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            if b"connection: close" in head.lower():
                await reader.read()
                return "closed (Connection: close)"
            try:
                data = await asyncio.wait_for(reader.read(1), self.args.every)
            except TimeoutError:
                continue
            return "closed" if not data else "unexpected bytes"


# ---- what clients with the key see -----------------------------------------------------------


async def normal_requests(http_port: int, grpc: str, stop: asyncio.Event, model: str) -> Any:
    """Every 0.5 s, whatever the ones before are doing: a completion over a new HTTP
    connection and a generate call over a new gRPC channel (30 s each at most); how each
    ended, counted."""
    from radixmesh.client import AsyncClient

    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 2}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    out = {"http": Counter[str](), "grpc": Counter[str]()}
    latency: dict[str, list[float]] = {"http": [], "grpc": []}

    async def http() -> None:
        t0 = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", http_port, local_addr=(NORMAL_ADDRESS, 0)), 30
            )
            writer.write(head + body)
            got = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            ok = got.startswith(b"HTTP/1.1 200")
            out["http"]["ok" if ok else got[:12].decode(errors="replace")] += 1
            if ok:
                latency["http"].append(time.monotonic() - t0)
        except (OSError, TimeoutError) as e:
            out["http"][type(e).__name__] += 1

    async def rpc() -> None:
        t0 = time.monotonic()
        try:
            async with AsyncClient(grpc, api_key=KEY) as client:
                await client.generate("hello", sampling_params={"max_new_tokens": 2}, timeout=30)
            out["grpc"]["ok"] += 1
            latency["grpc"].append(time.monotonic() - t0)
        except Exception as e:  # a failure is a figure here
            out["grpc"][type(e).__name__] += 1

    tasks: list[asyncio.Task[None]] = []
    while not stop.is_set():
        tasks += [asyncio.create_task(http()), asyncio.create_task(rpc())]
        await asyncio.sleep(0.5)
    await asyncio.gather(*tasks)
    return {
        api: {
            **counts,
            "p50_s": _quantile(latency[api], 0.5),
            "p99_s": _quantile(latency[api], 0.99),
        }
        for api, counts in out.items()
    }


def _quantile(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None


async def reaches_workers(address: str, stop: asyncio.Event, workers: int) -> dict[str, int]:
    """Once a second: does the router see every worker healthy (ClusterStatus)?"""
    import grpc

    from radixmesh.v1 import router_pb2, router_pb2_grpc

    seen = Counter[str]()
    metadata = (("authorization", f"Bearer {ADMIN}"),)
    while not stop.is_set():
        try:
            async with grpc.aio.insecure_channel(address) as ch:
                status = await router_pb2_grpc.RouterStub(ch).ClusterStatus(
                    router_pb2.ClusterStatusRequest(), metadata=metadata, timeout=10
                )
            healthy = sum(w.healthy for w in status.workers)
            seen["all healthy" if healthy == workers else f"{healthy} healthy"] += 1
        except grpc.aio.AioRpcError as e:
            seen[e.code().name] += 1
        await asyncio.sleep(1.0)
    return dict(seen)


# ---- processes ---------------------------------------------------------------------------------


def rss_mb(pids: dict[str, int]) -> dict[str, float]:
    import psutil

    return {
        name: round(psutil.Process(pid).memory_info().rss / 2**20, 1) for name, pid in pids.items()
    }


def extra_router(cluster: Any, port: int, *, keyed: bool) -> subprocess.Popen[bytes]:
    """`radixmesh router` on `port` in front of `cluster`'s workers (keyed: the API and
    admin keys; else none, so no gate)."""
    cmd = [sys.executable, "-m", "radixmesh.cluster.cli", "router", "--host", "127.0.0.1"]
    cmd += ["--workers", ",".join(cluster.worker_addresses), "--port", str(port)]
    cmd += ["--health-interval", "0.5"]
    if keyed:
        cmd += ["--api-key", KEY, "--admin-key", ADMIN]
    env = {**os.environ, "RADIXMESH_WORKER_API_KEY": cluster.worker_key}
    env.pop("RADIXMESH_API_KEY", None)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_serving(address: str, key: str | None, workers: int, timeout: float) -> float:
    """Seconds until the router at `address` sees every worker healthy (-1: never)."""
    import grpc

    from radixmesh.v1 import router_pb2, router_pb2_grpc

    t0 = time.monotonic()
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    while time.monotonic() - t0 < timeout:
        try:
            async with grpc.aio.insecure_channel(address) as ch:
                status = await router_pb2_grpc.RouterStub(ch).ClusterStatus(
                    router_pb2.ClusterStatusRequest(), metadata=metadata, timeout=2
                )
            if len(status.workers) == workers and all(w.healthy for w in status.workers):
                return round(time.monotonic() - t0, 2)
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.2)
    return -1.0


# ---- the phases --------------------------------------------------------------------------------


async def throughput(
    args: argparse.Namespace, gated: tuple[str, int], plain: tuple[str, int]
) -> dict[str, Any]:
    """Calls per second through each router (address, pid), `--rounds` alternating rounds
    of `--round-seconds`, `--clients` concurrent callers each; and the router process's
    CPU time per call, which other work on the machine disturbs less."""
    import psutil

    from radixmesh.client import AsyncClient

    cpu_ms: dict[str, list[float]] = {"gate": [], "no_gate": []}

    async def one_round(name: str, address: str, pid: int, key: str | None) -> float:
        done = 0
        end = time.monotonic() + args.round_seconds
        params = {"max_new_tokens": args.tokens, "ignore_eos": True}

        async def caller(client: AsyncClient) -> None:
            nonlocal done
            while time.monotonic() < end:
                await client.generate("hello there", sampling_params=params, timeout=60)
                done += 1

        async with AsyncClient(address, api_key=key) as client:
            await client.generate("warm", sampling_params=params, timeout=60)
            router = psutil.Process(pid)
            cpu0, t0 = sum(router.cpu_times()[:2]), time.monotonic()
            await asyncio.gather(*(caller(client) for _ in range(args.clients)))
            seconds, cpu = time.monotonic() - t0, sum(router.cpu_times()[:2]) - cpu0
        cpu_ms[name].append(1000 * cpu / max(1, done))
        return done / seconds

    rates: dict[str, list[float]] = {"gate": [], "no_gate": []}
    for _ in range(args.rounds):
        rates["gate"].append(await one_round("gate", *gated, KEY))
        rates["no_gate"].append(await one_round("no_gate", *plain, None))
    mean = {k: sum(v) / len(v) for k, v in rates.items()}
    cpu = {k: sum(v) / len(v) for k, v in cpu_ms.items()}
    return {
        "calls_per_s": {k: [round(x, 2) for x in v] for k, v in rates.items()},
        "mean_calls_per_s": {k: round(v, 2) for k, v in mean.items()},
        "gate_cost_pct": round(100 * (1 - mean["gate"] / mean["no_gate"]), 1),
        "router_cpu_ms_per_call": {k: [round(x, 3) for x in v] for k, v in cpu_ms.items()},
        "mean_router_cpu_ms_per_call": {k: round(v, 3) for k, v in cpu.items()},
        "gate_cpu_cost_pct": round(100 * (cpu["gate"] / cpu["no_gate"] - 1), 1),
    }


async def flood_phase(
    args: argparse.Namespace, kind: str, port: int, http_port: int, cluster: Any, pids: Any
) -> dict[str, Any]:
    path = GET_LOAD if kind == "worker" else GENERATE
    flood = Flood(args, kind, port, path)
    stop = asyncio.Event()
    flooding = asyncio.create_task(flood.run())
    peak: dict[str, float] = {}

    async def sample() -> None:
        while not stop.is_set():
            for name, mb in rss_mb(pids).items():
                peak[name] = max(peak.get(name, 0.0), mb)
            await asyncio.sleep(1.0)

    normal = asyncio.create_task(normal_requests(http_port, cluster.address, stop, args.model))
    status = asyncio.create_task(reaches_workers(cluster.address, stop, args.workers))
    sampler = asyncio.create_task(sample())
    out: dict[str, Any] = {}
    await asyncio.sleep(args.ramp_wait)  # the flood in place
    if kind == "worker":  # a router (re)started while the worker's port is flooded
        address_port = _free_port()
        proc = extra_router(cluster, address_port, keyed=True)
        try:
            out["new_router_serving_s"] = await wait_serving(
                f"127.0.0.1:{address_port}", ADMIN, args.workers, args.hold
            )
        finally:
            proc.terminate()
            proc.wait(30)
    await asyncio.sleep(max(0.0, args.hold - args.ramp_wait))
    stop.set()
    flood.stop.set()
    await flooding
    out |= {
        "normal": await normal,
        "router_sees_workers": await status,
        "flood_events": dict(sorted(flood.events.items())),
        "flood_open_peak": flood.peak,
        "rss_peak_mb": peak,
    }
    await sampler
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import psutil

    from radixmesh.cluster.launch import LocalCluster
    from radixmesh.cluster.spec import LaunchSpec

    http_port = _free_port()
    spec = LaunchSpec(
        model=args.model,
        workers=args.workers,
        port=_free_port(),
        api_keys=(KEY,),
        admin_keys=(ADMIN,),
        router_options={"http_port": http_port, "health_interval": 0.5},
        ready_timeout=300.0,
    )
    figures: dict[str, Any] = {}
    with LocalCluster(spec) as cluster:
        assert cluster.router is not None
        pids = {"router": cluster.router.pid}
        for i, proc in enumerate(cluster.workers):
            pids[f"worker {i}"] = proc.pid
            # the engine runs in a child of the worker process
            for child in psutil.Process(proc.pid).children(recursive=True):
                pids[f"worker {i} engine"] = child.pid
        plain_port = _free_port()
        plain = extra_router(cluster, plain_port, keyed=False)
        try:
            plain_address = f"127.0.0.1:{plain_port}"
            await wait_serving(plain_address, None, args.workers, 120)
            if args.rounds:
                figures["throughput"] = await throughput(
                    args, (cluster.address, cluster.router.pid), (plain_address, plain.pid)
                )
        finally:
            plain.terminate()
            plain.wait(30)
        figures["rss_before_mb"] = rss_mb(pids)
        worker_port = int(cluster.worker_addresses[0].rsplit(":", 1)[1])
        router_port = int(cluster.address.rsplit(":", 1)[1])
        ports = {"grpc": router_port, "http": http_port, "worker": worker_port}
        figures["floods"] = {}
        for kind in filter(None, args.kinds.split(",")):
            figures["floods"][kind] = await flood_phase(
                args, kind, ports[kind], http_port, cluster, pids
            )
        await asyncio.sleep(args.settle)
        figures["rss_after_mb"] = rss_mb(pids)
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=9000)
    ap.add_argument("--per-address", type=int, default=500, help="flood connections per source")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between keyless calls")
    ap.add_argument("--hold", type=float, default=60.0, help="seconds of each flood")
    ap.add_argument("--ramp", type=float, default=1000.0, help="new flood connections per second")
    ap.add_argument("--ramp-wait", type=float, default=10.0, help="seconds before the new router")
    ap.add_argument("--reconnect-delay", type=float, default=5.0)
    ap.add_argument("--kinds", default="grpc,http,worker")
    ap.add_argument("--settle", type=float, default=60.0, help="seconds before the last RSS")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--clients", type=int, default=8, help="throughput: concurrent callers")
    ap.add_argument("--tokens", type=int, default=8, help="throughput: tokens per call")
    ap.add_argument("--rounds", type=int, default=3, help="throughput: rounds per router")
    ap.add_argument("--round-seconds", type=float, default=10.0)
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    figures = asyncio.run(run(args))
    _print(figures)
    record.write("keyless_flood", args, figures)
    return figures


def _print(f: dict[str, Any]) -> None:
    if "throughput" in f:
        t = f["throughput"]["mean_calls_per_s"]
        c = f["throughput"]["mean_router_cpu_ms_per_call"]
        print(f"router gRPC calls/s: gate {t['gate']}, no gate {t['no_gate']} "
              f"(gate cost {f['throughput']['gate_cost_pct']}%)")  # fmt: skip
        print(f"router CPU ms per call: gate {c['gate']}, no gate {c['no_gate']} "
              f"(gate cost {f['throughput']['gate_cpu_cost_pct']}%)")  # fmt: skip
    print(f"{'flood':8}{'http ok/all':>14}{'grpc ok/all':>14}{'sees workers':>16}{'peak open':>11}")
    for kind, p in f["floods"].items():
        cells = []
        for api in ("http", "grpc"):
            counts = {k: v for k, v in p["normal"][api].items() if not k.startswith("p")}
            cells.append(f"{counts.get('ok', 0)}/{sum(counts.values())}")
        seen = p["router_sees_workers"]
        cells.append(f"{seen.get('all healthy', 0)}/{sum(seen.values())}")
        print(f"{kind:8}{cells[0]:>14}{cells[1]:>14}{cells[2]:>16}{p['flood_open_peak']:>11}")
        print(f"         events: {p['flood_events']}")
        lat = {
            api: (p["normal"][api]["p50_s"], p["normal"][api]["p99_s"]) for api in ("http", "grpc")
        }
        print(f"         normal latency p50/p99 s: {lat}")
        if "new_router_serving_s" in p:
            print(f"         a new router saw every worker after {p['new_router_serving_s']} s")
    print("RSS MB (before / peak of each flood / after):")
    for name, before in f["rss_before_mb"].items():
        peaks = " / ".join(str(p["rss_peak_mb"].get(name)) for p in f["floods"].values())
        print(f"  {name:16}{before} / {peaks} / {f['rss_after_mb'][name]}")


if __name__ == "__main__":
    main()
