"""A log of Triton's kernel compiles: which kernel, which specialization, how long it took,
and in which phase of the engine's life and which step it happened.

Triton compiles a kernel at its first launch with each new specialization: each set of
constexpr values and each pattern of its integer arguments (1, a multiple of 16, or
neither; pointers: 16-byte aligned or not). A compile in the middle of a batch stalls it
(~0.1-1 s each). `CompileLog` records every one through Triton's own hooks,
`triton.knobs.runtime.jit_cache_hook` (called before a compile) and
`jit_post_compile_hook` (after it), with their seconds apart:

    with CompileLog(phase="start") as log:
        engine = Engine(...)                 # graph capture, then the warm-up's own phase
        tag_steps(engine.worker.scheduler)   # each compile names the step it was in
        with log.in_phase("first"):
            ...

The hooks are set only while a log is open (hooks set before are kept and called first)
and put back when it closes. Triton consults them only when it compiles, so a launch of
a kernel it has compiled costs the same with a log open or not, and nothing runs at all
without one: `compile_phase` and `note_step`, which the warm-up calls, check for an open
log and return.

A kernel found in Triton's disk cache (TRITON_CACHE_DIR) passes through the same hooks in
milliseconds; bench/cold_start.py gives each run an empty cache, so its log holds real
compiles. Under TRITON_INTERPRET (CPU) Triton interprets kernels and compiles none: the
hooks never fire and the log stays empty. Library kernels (cuBLAS, the CUDA FP8 decode
kernel, built before the worker is ready) are not Triton's and are not in it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from radixmesh.worker.batch import Batch, ForwardOutput


@dataclass(frozen=True)
class TritonCompile:
    """One compile: `kernel` is module.function; `signature` the specialization, one entry
    per argument: `name=value` for a constexpr (an int argument equal to 1 becomes one),
    `name:type/16` for a pointer or int Triton found divisible by 16 and `name:type` for
    one it did not; then the launch's warps and stages. `phase` is the log's phase at the
    time; `step` the 1-based number of the step within the phase and `batch` its rows
    (`describe_rows`), when a step had been noted in the phase (None before the first)."""

    kernel: str
    signature: str
    seconds: float
    phase: str
    step: int | None = None
    batch: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_rows(new_tokens: list[int]) -> str:
    """A step's shape from its rows' new-token counts: "1024 decode rows", "prefill 2
    chunks, 640 tokens" or "mixed: 600 decode rows + 1 chunk, 128 tokens" (a one-token
    prompt counts as a decode row: it runs as one)."""
    chunks = [n for n in new_tokens if n > 1]
    decode = len(new_tokens) - len(chunks)
    rows = f"{decode} decode row{'s' if decode != 1 else ''}"
    if not chunks:
        return rows
    part = f"{len(chunks)} chunk{'s' if len(chunks) != 1 else ''}, {sum(chunks)} tokens"
    return f"mixed: {rows} + {part}" if decode else f"prefill {part}"


class CompileLog:
    """Every Triton compile while open (`open`/`close`, or as a context manager), in order:
    `compiles`. At most one log is open in a process (Triton's hooks are process-wide);
    compiles on any thread land in it."""

    def __init__(self, phase: str = "start") -> None:
        self.compiles: list[TritonCompile] = []
        self._phase = phase
        self._step = 0  # steps noted in this phase
        self._batch: Batch | None = None  # the last step noted in this phase
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, str], float] = {}  # (kernel id, key) -> start
        self._previous: tuple[Any, Any] | None = None  # the hooks set before: put back

    # ---- phases and steps -------------------------------------------------------------

    @property
    def phase(self) -> str:
        return self._phase

    def set_phase(self, phase: str) -> None:
        """Label the compiles from now on with `phase`, counting its steps from 1."""
        with self._lock:
            self._phase, self._step, self._batch = phase, 0, None

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        """`phase` while inside, the phase before it afterwards (its steps counted anew)."""
        before = self._phase
        self.set_phase(phase)
        try:
            yield
        finally:
            self.set_phase(before)

    def note_step(self, batch: Batch) -> None:
        """A step is about to launch its kernels (kept by reference; described only if
        something compiles)."""
        with self._lock:
            self._step += 1
            self._batch = batch

    # ---- Triton's hooks ---------------------------------------------------------------

    def open(self) -> CompileLog:
        global _active
        import triton  # only here: the engine does not need Triton on a CPU

        runtime = triton.knobs.runtime
        with _active_lock:
            if _active is not None:
                raise RuntimeError("a Triton compile log is already open in this process")
            self._previous = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
            runtime.jit_cache_hook = self._before_compile
            runtime.jit_post_compile_hook = self._after_compile
            _active = self
        return self

    def close(self) -> None:
        global _active
        import triton

        with _active_lock:
            if _active is not self or self._previous is None:
                return
            runtime = triton.knobs.runtime
            runtime.jit_cache_hook, runtime.jit_post_compile_hook = self._previous
            self._previous = None
            _active = None

    def __enter__(self) -> CompileLog:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _before_compile(self, **kwargs: Any) -> bool | None:
        """jit_cache_hook: a true answer would skip the compile, so this one answers None
        (or what the hook set before it answered)."""
        previous = self._previous[0] if self._previous is not None else None
        if previous is not None:
            answer: bool | None = previous(**kwargs)
            if answer:
                return answer
        with self._lock:
            self._pending[(id(kwargs["fn"].jit_function), kwargs["key"])] = time.perf_counter()
        return None

    def _after_compile(self, **kwargs: Any) -> bool | None:
        """jit_post_compile_hook: the compile is done; record it."""
        end = time.perf_counter()
        previous = self._previous[1] if self._previous is not None else None
        fn, info = kwargs["fn"], kwargs["compile"]
        with self._lock:
            start = self._pending.pop((id(fn.jit_function), kwargs["key"]), end)
            batch = self._batch
            rows = None if batch is None else [it.num_new_tokens for it in batch.items]
            record = TritonCompile(
                kernel=f"{fn.module}.{fn.name}",
                signature=_signature(info),
                seconds=end - start,
                phase=self._phase,
                step=None if batch is None else self._step,
                batch=None if rows is None else describe_rows(rows),
            )
            self.compiles.append(record)
        return previous(**kwargs) if previous is not None else None

    # ---- reading it -------------------------------------------------------------------

    def records(self, *phases: str) -> list[dict[str, Any]]:
        """The compiles as dicts, in order; only those of `phases` when any are named."""
        with self._lock:
            return [c.as_dict() for c in self.compiles if not phases or c.phase in phases]

    def summary(self) -> dict[str, dict[str, float]]:
        """Per phase, in order of first compile: {"compiles": count, "seconds": total}."""
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            for c in self.compiles:
                s = out.setdefault(c.phase, {"compiles": 0, "seconds": 0.0})
                s["compiles"] += 1
                s["seconds"] += c.seconds
        return out


def _signature(info: dict[str, Any]) -> str:
    """The specialization of one compile (`TritonCompile.signature`) from the hook's
    `compile` information: its signature (argument name -> type, "constexpr" for a
    constant), constants (argument path -> value) and attributes (argument path ->
    [[name, value], ...], e.g. tt.divisibility 16)."""
    signature: dict[str, str] = info.get("signature") or {}
    constants: dict[tuple[int, ...], Any] = info.get("constants") or {}
    configs = info.get("configs") or [{}]
    attrs: dict[tuple[int, ...], Any] = configs[0] if configs else {}
    parts = []
    for i, (name, kind) in enumerate(signature.items()):
        if (i,) in constants:
            parts.append(f"{name}={_constant(constants[(i,)])}")
        else:  # (a tuple argument's types and attributes by path: not used here)
            divisible = any(a and a[0] == "tt.divisibility" for a in attrs.get((i,), ()))
            parts.append(f"{name}:{kind}{'/16' if divisible else ''}")
    parts.append(f"warps={info.get('num_warps')}, stages={info.get('num_stages')}")
    return ", ".join(parts)


def _constant(value: Any) -> str:
    fn = getattr(value, "fn", None)  # a JIT function passed as a constexpr
    if fn is not None and hasattr(fn, "__qualname__"):
        return str(fn.__qualname__)
    return str(getattr(value, "value", value))  # tl.constexpr wraps its value


# ---- the process's open log, for the worker's parts that label what they run --------------

_active: CompileLog | None = None
_active_lock = threading.Lock()


def active() -> CompileLog | None:
    """The log open in this process, if any."""
    return _active


@contextmanager
def compile_phase(phase: str) -> Iterator[None]:
    """The open log's compiles labelled `phase` while inside (the phase before it after);
    nothing without an open log."""
    log = _active
    if log is None:
        yield
        return
    with log.in_phase(phase):
        yield


def note_step(batch: Batch) -> None:
    """Tell the open log, if any, that `batch` is about to launch."""
    log = _active
    if log is not None:
        log.note_step(batch)


class _Runner(Protocol):
    def forward(self, batch: Batch) -> ForwardOutput: ...


class _StepNoting:
    """A runner that notes each step for the open log, then runs it."""

    def __init__(self, runner: _Runner) -> None:
        self.runner = runner

    def forward(self, batch: Batch) -> ForwardOutput:
        note_step(batch)
        return self.runner.forward(batch)


class _HasRunner(Protocol):
    runner: Any


def tag_steps(scheduler: _HasRunner) -> None:
    """Wrap `scheduler`'s runner so that each step is noted for the open log (a benchmark's
    choice: serving never wraps it). Call it while the scheduler is idle."""
    if not isinstance(scheduler.runner, _StepNoting):
        scheduler.runner = _StepNoting(scheduler.runner)
