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
  the CPU that serving leaves.

A process compiles with a `GrammarCompiler` that a backend describes by a picklable
`CompilerSpec`, and sends back the compiled grammar serialized (xgrammar's JSON, a pickled
outlines index); the backend's `load` turns it back into a grammar in the engine. Every
failure reaches the caller as a `GrammarError` whose message says what happened.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import resource
import signal
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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

    @property
    def cpu_limit(self) -> int:
        return self.cpu_seconds or math.ceil(self.timeout) + 1


class CompilePool:
    """Compiles on `limits.processes` processes started on first use (or `start()`)."""

    def __init__(self, spec: CompilerSpec, limits: CompileLimits) -> None:
        self.spec = spec
        self.limits = limits
        self._pool: ProcessPool | None = None
        self._lock = threading.Lock()
        self.stopped = 0  # compiles a limit stopped (time, CPU, memory) or a broken pool failed

    def start(self) -> None:
        self._running_pool()

    def submit(self, kind: str, text: str) -> Future[str | bytes]:
        """The serialized grammar, or a GrammarError saying why there is none
        (CompileStopped: a limit stopped the compile)."""
        out: Future[str | bytes] = Future()
        try:
            running = self._running_pool().schedule(
                _compile, (kind, text, self.limits.cpu_limit), timeout=self.limits.timeout
            )
        except RuntimeError as e:  # the pool broke just now: the next submit replaces it
            out.set_exception(CompileStopped(f"could not be compiled: {e}"))
            return out
        running.add_done_callback(lambda f: self._settle(f, out))
        return out

    def _settle(self, done: Future[Any], out: Future[str | bytes]) -> None:
        from pebble import ProcessExpired

        try:
            out.set_result(done.result())
            return
        except GrammarError as e:
            out.set_exception(e)
            return
        except FutureTimeout:
            why = f"did not compile within {self.limits.timeout:g} s (the compile was stopped)"
        except MemoryError:
            why = f"needed more than {self.limits.memory_bytes >> 20} MiB to compile"
        except ProcessExpired as e:
            reason = _EXIT_REASONS.get(e.exitcode, f"exit status {e.exitcode}")
            why = f"stopped the compiler process: {reason}"
        except Exception as e:  # a broken pool: the next submit starts a new one
            why = f"could not be compiled: {type(e).__name__}: {e}"
        self.stopped += 1
        out.set_exception(CompileStopped(why))

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
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload([__name__, self.spec.module])
                pool = ProcessPool(
                    max_workers=self.limits.processes,
                    initializer=_init,
                    initargs=(self.spec, self.limits.memory_bytes),
                    context=context,
                )
                self._pool = pool
                if not pool.active:  # starts its processes
                    raise CompileStopped("could not be compiled: the compiler did not start")
            return pool

    def shutdown(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.stop()
                self._pool.join(timeout=5)
                self._pool = None


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


def _compile(kind: str, text: str, cpu_seconds: int) -> str | bytes:
    assert _compiler is not None, "the pool process was not initialized"
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + cpu_seconds
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.getrlimit(resource.RLIMIT_CPU)[1]))
    return _compiler.compile_serialized(kind, text)


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
