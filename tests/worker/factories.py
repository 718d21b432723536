"""Small factories for worker tests (dummy:tiny model, exact scheduling assertions)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.batch import Batch, ForwardOutput
from radixmesh.worker.config import EngineConfig
from radixmesh.worker.request import Request, RequestOutput
from radixmesh.worker.worker import Worker

_ids = itertools.count()


def make_worker(model: str = "dummy:tiny", **options: Any) -> Worker:
    options.setdefault("dtype", "float32")  # exact-token assertions need bit-stable math
    options.setdefault("kv_cache_tokens", 1024)
    options.setdefault("max_running_requests", 8)
    return Worker(EngineConfig.from_options(model=model, **options))


@dataclass
class Recorder:
    """Wraps the runner: records (rid, num_new_tokens) of every step."""

    steps: list[list[tuple[str, int]]] = field(default_factory=list)

    def attach(self, worker: Worker) -> Recorder:
        inner = worker.runner.forward

        def forward(batch: Batch) -> ForwardOutput:
            self.steps.append([(it.req.rid, it.num_new_tokens) for it in batch.items])
            return inner(batch)

        worker.scheduler.runner = _Wrapped(forward)
        return self

    def computed_tokens(self) -> int:
        """Tokens the recorded steps computed (every row's new tokens)."""
        return sum(n for step in self.steps for _, n in step)

    def admission_order(self) -> list[str]:
        seen: list[str] = []
        for step in self.steps:
            for rid, _ in step:
                if rid not in seen:
                    seen.append(rid)
        return seen


class _Wrapped:
    def __init__(self, fn: Any) -> None:
        self.forward = fn


@dataclass(eq=False)
class RecordedRequest(Request):
    """A request whose sink keeps every output, in order: what a client would have seen.
    A subclass rather than an attribute set on a `Request`, so tests read `outputs` typed."""

    outputs: list[RequestOutput] = field(default_factory=list)


def make_request(
    worker: Worker, prompt_ids: list[int], rid: str | None = None, **params: Any
) -> RecordedRequest:
    params.setdefault("temperature", 0.0)
    params.setdefault("ignore_eos", True)
    sp = SamplingParams(**params)
    req = RecordedRequest(
        rid=rid or f"r{next(_ids)}",
        prompt_ids=list(prompt_ids),
        params=sp,
        stop_ids=worker.stop_ids(sp),
    )
    req.sink = req.outputs.append
    return req


def run_to_completion(worker: Worker, max_steps: int = 10_000) -> int:
    steps = 0
    while worker.scheduler.has_work():
        worker.scheduler.step()
        assert_slots_accounted(worker)
        steps += 1
        assert steps < max_steps, "scheduler did not finish"
    return steps


def assert_slots_accounted(worker: Worker) -> None:
    """free + cached (tree) + held by running requests + trimmed (rejected drafts' slots,
    given back at the next launch) == usable, exactly."""
    free = worker.allocator.num_free_slots
    cached = worker.cache.total_size()
    held = worker.scheduler.slots_held_by_requests()
    trimmed = worker.scheduler.slots.num_trimmed
    assert free + cached + held + trimmed == worker.allocator.num_usable_slots, (
        f"free {free} + cached {cached} + held {held} + trimmed {trimmed} "
        f"!= {worker.allocator.num_usable_slots}"
    )


def all_free_after_flush(worker: Worker) -> bool:
    assert worker.flush_cache()
    return worker.allocator.num_free_slots == worker.allocator.num_usable_slots
