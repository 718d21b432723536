"""The load generator: sessions arrive open-loop (Poisson) or at a fixed concurrency.

Open loop: session i starts at the i-th arrival of a Poisson process of `request_rate`
sessions per second, whether or not earlier ones finished (the load a service sees from
many independent users). Closed loop: `max_concurrency` sessions run at once, each
starting as another ends. Both may be combined (arrivals capped at a concurrency), as in
SGLang's `bench_serving`. A session's turns run one after another, `think_time` apart.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from bench.serving.clients import Backend, RequestResult
from bench.serving.workloads import Prompt, Session, Workload, extend_history


@dataclass(frozen=True)
class LoadSpec:
    request_rate: float = float("inf")  # sessions per second; inf: all at once
    max_concurrency: int | None = None  # sessions in flight at most; None: no cap
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.request_rate > 0:
            raise ValueError(f"request_rate: must be > 0, got {self.request_rate}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency: must be >= 1, got {self.max_concurrency}")

    @property
    def label(self) -> str:
        rate = "inf" if self.request_rate == float("inf") else f"{self.request_rate:g}"
        cap = f" c={self.max_concurrency}" if self.max_concurrency else ""
        return f"{rate}/s{cap}"


@dataclass
class RunResult:
    results: list[RequestResult] = field(default_factory=list)
    duration: float = 0.0  # seconds from the first send to the last reply


async def run_load(workload: Workload, backend: Backend, spec: LoadSpec) -> RunResult:
    """Send every session of `workload` through `backend` as `spec` says."""
    if workload.mode == "ids" and not backend.gives_ids and _multi_turn(workload):
        raise ValueError(
            f"backend: {backend.name} returns text, but multi-turn token-id prompts need the "
            "reply's ids (use the grpc backend, or text prompts)"
        )
    run = RunResult()
    gate = asyncio.Semaphore(spec.max_concurrency or len(workload.sessions) or 1)
    rng = random.Random(spec.seed)
    started = time.perf_counter()

    async def session(s: Session) -> None:
        async with gate:
            await _run_session(s, backend, run.results, started)

    tasks = []
    for i, s in enumerate(workload.sessions):
        if i and spec.request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(spec.request_rate))
        tasks.append(asyncio.create_task(session(s)))
    await asyncio.gather(*tasks)
    run.duration = time.perf_counter() - started
    return run


async def _run_session(
    s: Session, backend: Backend, out: list[RequestResult], started: float
) -> None:
    prompt: Prompt = s.turns[0].message
    last: RequestResult | None = None
    for turn in s.turns:
        if last is not None:
            reply: Prompt = last.reply_ids if isinstance(prompt, list) else last.reply_text
            prompt = extend_history(prompt, reply, turn.message)
            if s.think_time > 0:
                await asyncio.sleep(s.think_time)
        last = RequestResult(start=time.perf_counter() - started, ideal_cached=turn.ideal_cached)
        await backend.send(prompt, turn.max_tokens, last)
        out.append(last)
        if not last.ok:
            return


def _multi_turn(w: Workload) -> bool:
    return any(len(s.turns) > 1 for s in w.sessions)
