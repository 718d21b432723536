"""A burst of HTTP requests at once against a local cluster (`radixmesh launch`'s
launcher: one router, N workers, default limits): how many are served, refused for load
(429) and refused for want of a worker (503), whether each refusal says when to retry,
and how many of the router's health polls found a worker slow but streaming.

A 503 here means the router judged every worker down while they were serving: the
figure docs/reliability.md gives before and after the router told busy from dead. Run it
against another checkout by putting that one first on PYTHONPATH (the launcher starts the
router and workers from the radixmesh it imports).

    python -m bench.health_burst --model smollm2 --requests 3000
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import record

BENCHMARK = "health_burst"


async def fire(url: str, n: int, max_tokens: int, timeout: float) -> dict[str, Any]:
    """n /v1/completions requests at once: status counts and Retry-After presence."""
    import aiohttp

    statuses: Counter[str] = Counter()
    without_retry_after: Counter[str] = Counter()
    body = {"model": "", "prompt": "Tell me about the sea.", "max_tokens": max_tokens}

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        try:
            async with session.post(url + "/v1/completions", json=body) as resp:
                await resp.read()
                status = str(resp.status)
                if resp.status in (429, 503) and "Retry-After" not in resp.headers:
                    without_retry_after[status] += 1
        except (aiohttp.ClientError, TimeoutError) as e:
            status = type(e).__name__
        statuses[status] += 1

    connector = aiohttp.TCPConnector(limit=0)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as session:
        async with session.get(url + "/v1/models") as resp:
            body["model"] = (await resp.json())["data"][0]["id"]
        started = time.monotonic()
        await asyncio.gather(*(one(session, i) for i in range(n)))
        seconds = time.monotonic() - started
        async with session.get(url + "/metrics") as resp:
            metrics = await resp.text()
    slow = re.findall(r"radixmesh_router_worker_slow_health_polls_total\{.*\} (\S+)", metrics)
    return {
        "statuses": dict(sorted(statuses.items())),
        "refusals_without_retry_after": dict(without_retry_after),
        "slow_health_polls": int(sum(float(v) for v in slow)) if slow else None,
        "seconds": round(seconds, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    record.add_output_arguments(ap)
    args = ap.parse_args()

    import radixmesh
    from radixmesh.cluster.launch import LocalCluster, free_port
    from radixmesh.cluster.spec import LaunchSpec

    http_port = free_port()
    spec = LaunchSpec(
        model=args.model,
        workers=args.workers,
        port=free_port(),
        router_options={"http_port": http_port},
        ready_timeout=300.0,
    )
    runs = []
    with LocalCluster(spec):
        for _ in range(args.runs):
            url = f"http://127.0.0.1:{http_port}"
            runs.append(asyncio.run(fire(url, args.requests, args.max_tokens, args.timeout)))
            time.sleep(2.0)  # the workers settle between runs
    print(f"radixmesh from {Path(radixmesh.__file__).parent}")
    head = ("run", "seconds", "200", "429", "503", "other", "slow polls")
    print(" ".join(f"{h:>{max(len(h), 6)}}" for h in head))
    for i, r in enumerate(runs):
        s = r["statuses"]
        other = sum(v for k, v in s.items() if k not in ("200", "429", "503"))
        slow = "-" if r["slow_health_polls"] is None else r["slow_health_polls"]
        row = (i, r["seconds"], s.get("200", 0), s.get("429", 0), s.get("503", 0), other, slow)
        print(" ".join(f"{v!s:>{max(len(h), 6)}}" for h, v in zip(head, row, strict=True)))
    figures = {"radixmesh_from": str(Path(radixmesh.__file__).parent), "runs": runs}
    record.write(BENCHMARK, args, figures, name=f"{args.model.replace(':', '-')}")


if __name__ == "__main__":
    main()
