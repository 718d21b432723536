"""`StepRecorder`: each engine step's batch, host phases and profiler ranges, for the
prefill anatomy (bench/anatomy/prefill.py, which reads the module doc there).

Wraps the scheduler's step and its parts on the engine's scheduler thread: `StepInfo`
per `Scheduler.step` call, the `anatomy::<region>` ranges kernels are classified by, the
wait for a step's sampled ids, and the collector's pauses inside a step.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.anatomy.kernel_trace import LABEL
from bench.anatomy.timer import PhaseTimer
from radixmesh.worker.batch import NO_TOKENS, Batch, Launched
from radixmesh.worker.engine import Engine

# ---- the steps ------------------------------------------------------------------------


@dataclass
class StepInfo:
    """One `Scheduler.step` call: the batch it launched (kind "none": none) and its time."""

    kind: str = "none"
    rows: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt rows' tokens before this chunk (a reused prefix)
    decode_rows: int = 0
    extend_keys: int = 0  # keys read by the prompt rows' queries, causal
    decode_keys: int = 0
    graphed: bool = False
    wall_ms: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)


def describe(batch: Batch) -> StepInfo:
    """The batch's rows before `launch` moves their computed-token counts."""
    info = StepInfo(rows=len(batch.items))
    for it in batch.items:
        s, n = it.start, it.num_new_tokens
        keys = n * s + n * (n + 1) // 2
        info.tokens += n
        if s < it.req.num_prompt_tokens:
            info.prompt_tokens += n
            info.cached_tokens += s
            info.extend_keys += keys
        else:
            info.decode_rows += 1
            info.decode_keys += keys
    if info.prompt_tokens == 0:
        info.kind = "decode"
    else:
        info.kind = "mixed" if info.decode_rows else "prefill"
    return info


class StepRecorder:
    """Wraps the scheduler's step, its phases and the regions kernels are classified by."""

    def __init__(self, engine: Engine) -> None:
        self.sched = engine.worker.scheduler
        self.runner = engine.worker.runner
        self.timer = PhaseTimer()
        self.steps: list[StepInfo] = []
        self.profiled: list[StepInfo] = []
        self.prof: Any = None
        self.trace: Any = None
        self.decode_steps = 0  # stop profiling after this many decode steps (0: never)
        self._decode_seen = 0
        self._step_thread: int | None = None  # the thread inside a step call, if any
        self._gc_t0 = 0.0
        gc.callbacks.append(self._gc_pause)
        self._current = StepInfo()
        for obj, name, phase in (
            (self.sched, "schedule", "schedule"),
            (self.sched, "process_output", "process_output"),
            (self.runner, "forward", "forward"),
            (self.runner.sampler, "draw", "sampler"),
        ):
            self.timer.wrap(obj, name, phase)
        self._label_regions()
        self._wrap_launch()
        self._wrap_step()

    def _label_regions(self) -> None:
        from radixmesh.worker.layers.activation import SiluAndMul
        from radixmesh.worker.layers.norm import RMSNorm

        _label(self.runner.sampler, "draw", "sampling")
        _label(self.runner.attn, "forward", "attention")
        for m in self.runner.model.modules():
            if isinstance(m, RMSNorm | SiluAndMul):
                _label(m, "forward", "norm" if isinstance(m, RMSNorm) else "activation")

    def _wrap_launch(self) -> None:
        launch, graphs = self.sched.launch, self.runner.decode_graphs

        def described(batch: Batch) -> Any:
            info = describe(batch)
            replays = graphs.num_replays if graphs is not None else 0
            t0 = time.perf_counter()
            out = launch(batch)
            info.phases["launch"] = 1e3 * (time.perf_counter() - t0)
            self._time_wait(out)
            info.graphed = graphs is not None and graphs.num_replays > replays
            self._current = info
            return out

        self.sched.launch = described  # type: ignore[method-assign]

    def _gc_pause(self, phase: str, info: dict[str, int]) -> None:
        """The collector's pauses on the scheduler thread inside a step: phase "gc"."""
        if threading.get_ident() != self._step_thread:
            return
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.timer.current["gc"] += time.perf_counter() - self._gc_t0

    def close(self) -> None:
        gc.callbacks.remove(self._gc_pause)

    def _time_wait(self, launched: Launched) -> None:
        """Time this step's `token_ids` (the host blocking for its sampled ids) as phase
        "wait" of whichever step call reads them (with overlap, the next one). On the
        instance: the class stays untouched, and the empty step's shared NO_TOKENS too.
        A deferred draw (not one argmax: `ForwardOutput.draw`) replaces the step's tokens
        when it runs (its own time is phase "sampler"): theirs are wrapped then."""
        out = launched.out
        draw = out.pending_draw
        if draw is None:
            if out.tokens is not NO_TOKENS:
                self.timer.wrap(out.tokens, "token_ids", "wait")
            return

        def drawn() -> None:
            draw()
            self.timer.wrap(out.tokens, "token_ids", "wait")

        out.pending_draw = drawn

    def _wrap_step(self) -> None:
        step = self.sched.step

        def recorded() -> Any:
            self._current = StepInfo()
            self._step_thread = threading.get_ident()
            t0 = time.perf_counter()
            with torch.profiler.record_function(LABEL + "step"):
                out = step()
            self._step_thread = None
            info = self._current
            info.wall_ms = 1e3 * (time.perf_counter() - t0)
            info.phases.update(self.timer.take())
            self.steps.append(info)
            if self.prof is not None:
                self.profiled.append(info)
                if self.decode_steps and info.kind == "decode" and not self.sched.waiting:
                    self._decode_seen += 1
                    if self._decode_seen >= self.decode_steps:
                        self.stop()
            return out

        self.sched.step = recorded  # type: ignore[method-assign]

    def take(self) -> list[StepInfo]:
        """The steps so far, and a fresh record. Call it on the scheduler thread
        (`Engine.call`): a step's record lands after its outputs reach the caller."""
        steps, self.steps, self.profiled = self.steps, [], []
        return steps

    def start(self, decode_steps: int) -> None:
        """On the scheduler thread: the profiler records that thread's CPU ops. It stops
        after `decode_steps` decode steps with nothing waiting (0: at the run's end)."""
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.decode_steps, self._decode_seen = decode_steps, 0
        self.prof = profile(activities=activities, record_shapes=True)
        self.prof.start()

    def stop(self) -> None:
        if self.prof is None:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.prof.stop()
        self.trace, self.prof = self.prof, None


def _label(obj: Any, name: str, region: str) -> None:
    """obj.name runs inside a profiler range `anatomy::<region>`."""
    fn: Callable[..., Any] = getattr(obj, name)

    def labelled(*a: Any, **k: Any) -> Any:
        with torch.profiler.record_function(LABEL + region):
            return fn(*a, **k)

    setattr(obj, name, labelled)
