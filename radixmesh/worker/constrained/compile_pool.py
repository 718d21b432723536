"""Grammar compiles in a pool of killable processes, each under CPU-time and memory limits.

A grammar compile is native code a client can make arbitrarily expensive (a 1 MB JSON
schema grew a worker by 3 GB and ran for minutes on one core). In a thread it cannot be
stopped and it shares the engine's memory, so compiles run in `pebble` process pools:

- a compile running longer than `timeout` seconds gets its process killed (SIGTERM, which
  ends native code at once: the pool process takes SIGTERM's default action back from
  pebble), and the pool starts a fresh process in its place;
- the CPU time of each compile is capped with RLIMIT_CPU (SIGXCPU ends the process), a
  backstop for compilers that use several threads;
- each process's address space is capped at what it uses when idle plus `memory_bytes`
  (RLIMIT_AS): an allocation past it fails inside the compiler (MemoryError) or ends the
  process, never the worker;
- the processes run at a lower priority (nice +10) than the engine: a compile takes
  the CPU that serving leaves;
- a compiled grammar is sent back only when its serialized form stays under
  `max_compiled_bytes` (measured in the process before serializing: cost.py says why
  the serialized form is what grows).

Compiles wait in this pool's own queue, not first come first served: the engine has no
caller identity to be fair between (the router keeps it), so the queue is ordered by each
compile's estimated cost (cost.py). Small compiles (most: a regex, a schema of a few
fields) go first, in arrival order. Costly ones (estimated weight >= COSTLY_WEIGHT) go
in order of cost, at most `processes - 1` of them at once, so one process is always left
for small compiles: a small compile waits for other small compiles, never for a bomb.
At most `max_costly` costly compiles are running or waiting; one more is refused with
`Overloaded` (RESOURCE_EXHAUSTED, retry after the compile timeout), which the router
takes as a cue to try another worker. A costly compile goes before waiting small ones
when its lane is free, so a stream of small compiles cannot starve it either.

A process compiles with a `GrammarCompiler` that a backend describes by a picklable
`CompilerSpec`, and sends back the compiled grammar serialized (xgrammar's JSON, a pickled
outlines index); the backend's `load` turns it back into a grammar in the engine. A
compile that fails or is stopped reaches the caller as a `GrammarError` whose message
says what happened (the client's constraint: INVALID_ARGUMENT); compile processes that
cannot start or that the pool lost reach it as `Internal` (the server's fault: INTERNAL,
HTTP 500), never blamed on the constraint.

The processes never run the user's script. multiprocessing's forkserver and spawn
children re-run the parent's `__main__` (as `__mp_main__`) before they unpickle their
target, so a script that creates an in-process `Engine` at module level, without a
`if __name__ == "__main__":` guard, would start another engine in every compile process
and fail every compile with Python's bootstrapping error. The pool's processes are
forked from the forkserver (which preloads only this module and the compiler's, never
`__main__`), and their start is described without the main module (`_NoMainPopen`), so
a child imports only what it unpickles: radixmesh's own modules.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import resource
import signal
import threading
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from multiprocessing import context as mp_context
from multiprocessing import popen_forkserver, spawn
from typing import TYPE_CHECKING, Any

from radixmesh.errors import Internal, Overloaded
from radixmesh.worker.constrained.cost import COSTLY_WEIGHT
from radixmesh.worker.constrained.grammar import (
    CompilerSpec,
    CompileStopped,
    GrammarCompiler,
    GrammarError,
)

if TYPE_CHECKING:
    from pebble import ProcessPool

COMPILE_NICENESS = 10  # added to the compile processes' nice value
_EXIT_REASONS = {
    -signal.SIGXCPU: "it used up its CPU-time limit",
    -signal.SIGKILL: "it was killed (out of memory?)",
    -signal.SIGSEGV: "the compiler crashed",
    -signal.SIGABRT: "the compiler aborted (out of memory?)",
}


@dataclass(frozen=True)
class CompileLimits:
    timeout: float  # wall-clock seconds one compile may run
    memory_bytes: int  # address space a process may grow by while compiling
    processes: int = 2
    cpu_seconds: int | None = None  # CPU time of one compile; None: the timeout's, + 1 s
    max_compiled_bytes: int = 32 << 20  # a compiled grammar's serialized size
    max_costly: int = 4  # costly compiles running or waiting; one more: Overloaded

    @property
    def cpu_limit(self) -> int:
        return self.cpu_seconds or math.ceil(self.timeout) + 1

    @property
    def costly_lanes(self) -> int:
        """Processes costly compiles may hold at once: all but one (one process: it)."""
        return max(1, self.processes - 1)


@dataclass(order=True)
class _Job:
    weight: int
    seq: int
    kind: str = field(compare=False)
    text: str = field(compare=False)
    out: Future[str | bytes] = field(compare=False)

    @property
    def costly(self) -> bool:
        return self.weight >= COSTLY_WEIGHT


class CompilePool:
    """Compiles on `limits.processes` processes started on first use (or `start()`)."""

    def __init__(self, spec: CompilerSpec, limits: CompileLimits) -> None:
        self.spec = spec
        self.limits = limits
        self._pool: ProcessPool | None = None
        self._lock = threading.Lock()  # the process pool
        self._queue_lock = threading.Lock()  # the queue and the counts below
        self._small: deque[_Job] = deque()
        self._costly: list[_Job] = []  # a heap: cheapest first
        self._seq = itertools.count()
        self._running = 0
        self._running_costly = 0
        self.stopped = 0  # compiles a limit stopped (time, CPU, memory) or a broken pool failed

    def start(self) -> None:
        self._running_pool()

    def submit(self, kind: str, text: str, weight: int = 0) -> Future[str | bytes]:
        """The serialized grammar, or a GrammarError saying why there is none
        (CompileStopped: a limit stopped the compile). `weight`: its estimated cost
        (cost.CompileCost.weight). Raises Overloaded when it is costly and
        `limits.max_costly` costly compiles are already running or waiting."""
        job = _Job(weight, next(self._seq), kind, text, Future())
        with self._queue_lock:
            if job.costly:
                costly = self._running_costly + len(self._costly)
                if costly >= self.limits.max_costly:
                    raise Overloaded(
                        f"{costly} costly grammar compiles are running or waiting on this "
                        f"worker (at most {self.limits.max_costly})",
                        retry_after=self.limits.timeout,
                    )
                heapq.heappush(self._costly, job)
            else:
                self._small.append(job)
        self._dispatch()
        return job.out

    def _dispatch(self) -> None:
        """Start waiting compiles while a process is free for them (see the module doc)."""
        while True:
            with self._queue_lock:
                job = self._next()
                if job is None:
                    return
                self._running += 1
                self._running_costly += job.costly
            self._run(job)

    def _next(self) -> _Job | None:
        if self._running >= self.limits.processes:
            return None
        if self._costly and self._running_costly < self.limits.costly_lanes:
            return heapq.heappop(self._costly)
        return self._small.popleft() if self._small else None

    def _run(self, job: _Job) -> None:
        args = (job.kind, job.text, self.limits.cpu_limit, self.limits.max_compiled_bytes)
        try:
            running = self._running_pool().schedule(_compile, args, timeout=self.limits.timeout)
        except Exception as e:  # no process to compile on: the next run tries again
            self._finish(job, _not_started(e))
            return
        running.add_done_callback(lambda f: self._settle(f, job))

    def _finish(self, job: _Job, error: BaseException | None, result: Any = None) -> None:
        with self._queue_lock:
            self._running -= 1
            self._running_costly -= job.costly
        if error is None:
            job.out.set_result(result)
        else:
            job.out.set_exception(error)
        self._dispatch()

    def _settle(self, done: Future[Any], job: _Job) -> None:
        from pebble import ProcessExpired

        try:
            result = done.result()
        except GrammarError as e:
            self._finish(job, e)
            return
        except FutureTimeout:
            why = f"did not compile within {self.limits.timeout:g} s (the compile was stopped)"
        except MemoryError:
            why = self._memory_why()
        except ProcessExpired as e:
            reason = _EXIT_REASONS.get(e.exitcode, f"exit status {e.exitcode}")
            why = f"stopped the compiler process: {reason}"
        except Exception as e:
            # Native code out of memory: C++'s std::bad_alloc reaches Python as RuntimeError.
            if "bad_alloc" in str(e):
                why = self._memory_why()
            else:  # a broken pool (its processes died): the server's, not the constraint's
                self.stopped += 1
                self._finish(job, _not_started(e))
                return
        else:
            self._finish(job, None, result)
            return
        self.stopped += 1
        self._finish(job, CompileStopped(why))

    def _memory_why(self) -> str:
        return f"needed more than {self.limits.memory_bytes >> 20} MiB to compile"

    def _running_pool(self) -> ProcessPool:
        from pebble import ProcessPool  # imported when the first compile starts the pool

        with self._lock:
            pool = self._pool
            # pebble gives up on a pool whose process died while idle; start another.
            if pool is None or not pool.active:
                if pool is not None:
                    pool.stop()
                # Forked from a server that imported the compiler once: a process that
                # replaces a stopped one starts in milliseconds, not seconds.
                context = _NoMainContext()
                context.set_forkserver_preload([__name__, self.spec.module])
                pool = ProcessPool(
                    max_workers=self.limits.processes,
                    initializer=_init,
                    initargs=(self.spec, self.limits.memory_bytes),
                    context=context,
                )
                self._pool = pool
                if not pool.active:  # starts its processes
                    raise Internal("the compile processes did not start")
            return pool

    def shutdown(self) -> None:
        with self._queue_lock:
            waiting = [*self._small, *self._costly]
            self._small.clear()
            self._costly.clear()
        for job in waiting:
            job.out.set_exception(GrammarError("the worker is shutting down"))
        with self._lock:
            if self._pool is not None:
                self._pool.stop()
                self._pool.join(timeout=5)
                self._pool = None


def _not_started(e: BaseException) -> Internal:
    """The request's error when no compile process could take its compile."""
    why = str(e) if isinstance(e, Internal) else f"{type(e).__name__}: {e}"
    return Internal(f"the grammar compile processes could not start or stopped: {why}")


# ---- starting pool processes without __main__ ----------------------------------------------

# Set on the thread that launches a compile process, while it describes the child's start.
_launching = threading.local()
# multiprocessing's own (a second import of this module must not wrap its own wrapper)
_preparation_data = getattr(spawn.get_preparation_data, "wrapped", spawn.get_preparation_data)


def _preparation_data_without_main(name: str) -> dict[str, Any]:
    """multiprocessing's description of a child's start (sys.path, cwd, ...), without the
    main module while a compile process is launched: the child then imports no script.
    Every other launch gets multiprocessing's own description, unchanged."""
    data: dict[str, Any] = _preparation_data(name)
    if getattr(_launching, "compile_process", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


_preparation_data_without_main.wrapped = _preparation_data  # type: ignore[attr-defined]


class _NoMainPopen(popen_forkserver.Popen):
    """forkserver's start of a child, described without the main module. multiprocessing
    has no option for this, so its description (`spawn.get_preparation_data`, read when
    the child starts) is wrapped once, for this thread's launch only."""

    def _launch(self, process_obj: Any) -> None:
        if spawn.get_preparation_data is not _preparation_data_without_main:
            spawn.get_preparation_data = _preparation_data_without_main
        _launching.compile_process = True
        try:
            super()._launch(process_obj)  # type: ignore[misc]  # (typeshed omits _launch)
        finally:
            _launching.compile_process = False


class _NoMainProcess(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _NoMainPopen:
        return _NoMainPopen(process_obj)


class _NoMainContext(mp_context.ForkServerContext):
    """The forkserver context, its processes started without the main module."""

    Process = _NoMainProcess


# ---- inside a pool process ---------------------------------------------------------------

_compiler: GrammarCompiler | None = None


def _init(spec: CompilerSpec, memory_bytes: int) -> None:
    global _compiler
    # pebble handles SIGTERM in Python, which native code never returns to: take the
    # default action back, so a compile that ran out of time ends when it is told to.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Below the scheduler: a client's compile must not take the CPU that serving needs.
    os.nice(COMPILE_NICENESS)
    _compiler = spec.build()
    limit = _address_space_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _compile(kind: str, text: str, cpu_seconds: int, max_bytes: int) -> str | bytes:
    assert _compiler is not None, "the pool process was not initialized"
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + cpu_seconds
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.getrlimit(resource.RLIMIT_CPU)[1]))
    return _compiler.compile_serialized(kind, text, max_bytes)


def _address_space_bytes() -> int:
    """This process's virtual memory size now (Linux /proc; 0 where it is unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
