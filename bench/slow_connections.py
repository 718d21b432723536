"""The slow-connection probe: thousands of idle, slow and unfinished connections against a
local cluster's router, and what normal clients see meanwhile.

Starts `radixmesh launch` (its stdout and stderr, the router's log among them, into a
file), then holds `--connections` connections open for `--hold` seconds, spread evenly
over five kinds and over source addresses 127.0.0.1-127.0.0.N (`--per-address` each):

- `silent`: HTTP, sends nothing;            - `head`: HTTP, a head that never ends;
- `trickle`: HTTP, a head at 1 byte/s;      - `chunked`: HTTP, a chunked body at 1 byte/s;
- `grpc`: the gRPC port, sends nothing.

A connection the server closes is opened again after `--reconnect-delay` seconds (an
attacker that keeps trying). Meanwhile, every 0.5 s, a normal client makes a completion
over a new HTTP connection and one over a new gRPC channel (from an address of its own).
Reports the latencies before and during the flood, what the server did to the probe's
connections (refused with 503, closed with 408, closed), the router's peak descriptors,
and how much the log grew.

    python -m bench.slow_connections --connections 5000 --hold 40
    python -m bench.slow_connections --nofile 4096  # a router with fewer descriptors
    python -m bench.slow_connections --source /tmp/old-checkout  # the same, older code
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import record

KINDS = ("silent", "head", "trickle", "chunked", "grpc")
NORMAL_ADDRESS = "127.0.0.254"
_HEAD = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 4000 + b"\r\n\r\n"
_CHUNKED = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Flood:
    """The probe's connections, kept open (reopened when closed) until `stop` is set."""

    def __init__(self, args: argparse.Namespace, http_port: int, grpc_port: int) -> None:
        self.args = args
        self.ports = {kind: http_port for kind in KINDS} | {"grpc": grpc_port}
        self.events: Counter[str] = Counter()  # "<kind> <what happened>"
        self.open = Counter[str]()
        self.stop = asyncio.Event()

    async def run(self) -> None:
        n = self.args.connections
        tasks = [asyncio.create_task(self.hold(KINDS[i % len(KINDS)], i)) for i in range(n)]
        await self.stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def hold(self, kind: str, i: int) -> None:
        source = f"127.0.0.{1 + i // self.args.per_address}"
        await asyncio.sleep(i * 0.001)  # a thousand new connections a second
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.ports[kind], local_addr=(source, 0)
                )
            except OSError:
                self.events[f"{kind} connect failed"] += 1
                await asyncio.sleep(self.args.reconnect_delay)
                continue
            self.open[kind] += 1
            try:
                self.events[f"{kind} {await self.talk(kind, reader, writer)}"] += 1
            finally:
                self.open[kind] -= 1
                writer.close()
            await asyncio.sleep(self.args.reconnect_delay)

    async def talk(self, kind: str, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> str:
        """Send what `kind` sends until the server answers or closes; what it did."""
        payload = {"head": _HEAD, "trickle": _HEAD, "chunked": b"1\r\n \r\n" * 100_000}
        data = payload.get(kind, b"")
        if kind == "head":
            w.write(_HEAD[:-4])  # all but the end of the head
            data = b""
        elif kind == "chunked":
            w.write(_CHUNKED)
        while True:
            try:
                got = await asyncio.wait_for(reader.read(4096), 1.0 if data else None)
            except TimeoutError:
                w.write(data[:1])
                data = data[1:]
                continue
            except OSError:
                return "reset"
            if got.startswith(b"HTTP/1.1 503"):
                return "refused (503)"
            if got.startswith(b"HTTP/1.1 408"):
                return "closed (408)"
            if not got:
                return "closed"
            if kind == "grpc" and b"HTTP/2 settings" in got:
                return "closed (GOAWAY)"


async def normal_requests(
    http_port: int, grpc_address: str, seconds: float, model: str
) -> dict[str, list[float]]:
    """Every 0.5 s: a completion over a new HTTP connection and one over a new gRPC
    channel; their latencies in ms (a failure counts as -1)."""
    from radixmesh.client import AsyncClient

    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 2}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    out: dict[str, list[float]] = {"http": [], "grpc": []}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", http_port, local_addr=(NORMAL_ADDRESS, 0)
            )
            writer.write(head + body)
            ok = (await asyncio.wait_for(reader.read(), 30)).startswith(b"HTTP/1.1 200")
            writer.close()
        except (OSError, TimeoutError):
            ok = False
        out["http"].append((time.monotonic() - t0) * 1000 if ok else -1)
        t0 = time.monotonic()
        try:
            async with AsyncClient(grpc_address) as client:
                await client.generate("hello", sampling_params={"max_new_tokens": 2}, timeout=30)
            out["grpc"].append((time.monotonic() - t0) * 1000)
        except Exception:  # a failure is a figure here
            out["grpc"].append(-1)
        await asyncio.sleep(max(0.0, 0.5 - (time.monotonic() - t0)))
    return out


def summary(ms: list[float]) -> dict[str, Any]:
    ok = sorted(x for x in ms if x >= 0)

    def pick(q: float) -> float | None:
        return round(ok[min(len(ok) - 1, int(q * len(ok)))], 1) if ok else None

    return {"n": len(ms), "failed": len(ms) - len(ok), "p50_ms": pick(0.5), "p99_ms": pick(0.99)}


def router_fds(launcher: int) -> int:
    import psutil

    kids = psutil.Process(launcher).children(recursive=True)
    return sum(p.num_fds() for p in kids if "router" in " ".join(p.cmdline()))


async def probe(
    args: argparse.Namespace, http_port: int, grpc_port: int, pid: int
) -> dict[str, Any]:
    grpc_address = f"127.0.0.1:{grpc_port}"
    before = await normal_requests(http_port, grpc_address, args.baseline, args.model)
    flood = Flood(args, http_port, grpc_port)
    flooding = asyncio.create_task(flood.run())
    peak = {"fds": 0, "open": 0}

    async def sample() -> None:
        while not flood.stop.is_set():
            peak["fds"] = max(peak["fds"], router_fds(pid))
            peak["open"] = max(peak["open"], sum(flood.open.values()))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample())
    during = await normal_requests(http_port, grpc_address, args.hold, args.model)
    flood.stop.set()
    await asyncio.gather(flooding, sampler)
    return {
        "normal_before": {k: summary(v) for k, v in before.items()},
        "normal_during": {k: summary(v) for k, v in during.items()},
        "probe_events": dict(sorted(flood.events.items())),
        "probe_open_peak": peak["open"],
        "router_fds_peak": peak["fds"],
    }


def launch(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    http_port, grpc_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "radixmesh.cluster.cli", "launch", "--model", args.model]
    cmd += ["--workers", str(args.workers), "--port", str(grpc_port)]
    cmd += ["--http-port", str(http_port), *args.router_flags.split()]
    env = dict(os.environ)
    if args.source:
        env["PYTHONPATH"] = args.source

    def limit_descriptors() -> None:  # in the child, before exec: the whole cluster's
        if args.nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))

    with open(log, "wb") as out:
        proc = subprocess.Popen(  # cwd: `-m` puts it first on the path
            cmd, stdout=out, stderr=out, env=env, cwd=args.source, preexec_fn=limit_descriptors
        )
    deadline = time.monotonic() + 300
    while b"radixmesh router serving" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the cluster did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    time.sleep(2.0)  # the launcher checks readiness over gRPC after the router prints
    return proc, http_port, grpc_port


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=5000)
    ap.add_argument("--per-address", type=int, default=500, help="probe connections per source")
    ap.add_argument("--hold", type=float, default=40.0, help="seconds of flood")
    ap.add_argument("--baseline", type=float, default=5.0, help="seconds of normal load first")
    ap.add_argument("--reconnect-delay", type=float, default=1.0)
    ap.add_argument("--model", default="dummy:tiny")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--router-flags", default="", help="more `radixmesh launch` flags")
    ap.add_argument("--source", default=None, help="run the cluster from this source tree")
    ap.add_argument(
        "--nofile", type=int, default=0, help="the cluster's descriptor limit (0: this one's)"
    )
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    log = Path(tempfile.mkdtemp()) / "cluster.log"
    proc, http_port, grpc_port = launch(args, log)
    try:
        start = log.stat().st_size
        lines = len(log.read_bytes().splitlines())
        t0 = time.monotonic()
        figures = asyncio.run(probe(args, http_port, grpc_port, proc.pid))
        time.sleep(11.0)  # the listener's summary lines come every 10 s
        grown = log.read_bytes()[start:]
        figures["log_growth"] = {
            "bytes": len(grown),
            "lines": len(grown.splitlines()),
            "seconds": round(time.monotonic() - t0, 1),
            "before_flood_lines": lines,
        }
        figures["listener_lines"] = [
            line for line in grown.decode(errors="replace").splitlines() if "listener" in line
        ]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    _print(figures)
    record.write("slow_connections", args, figures)
    return figures


def _print(f: dict[str, Any]) -> None:
    print(f"{'':16}{'before p50/p99 ms':>22}{'during p50/p99 ms':>22}{'failed':>8}")
    for api in ("http", "grpc"):
        b, d = f["normal_before"][api], f["normal_during"][api]
        print(
            f"{api:16}{b['p50_ms']!s:>12}/{b['p99_ms']!s:<9}{d['p50_ms']!s:>12}/{d['p99_ms']!s:<9}"
            f"{d['failed']:>8}"
        )
    print(f"probe connections open at once (peak): {f['probe_open_peak']}")
    print(f"router descriptors (peak): {f['router_fds_peak']}")
    for event, n in f["probe_events"].items():
        print(f"  {event:32}{n:>8}")
    g = f["log_growth"]
    print(f"log: +{g['bytes']} bytes, +{g['lines']} lines in {g['seconds']} s")


if __name__ == "__main__":
    main()
