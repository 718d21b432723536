"""The compile pool: compiles in other processes, stopped at their time, CPU and memory
limits with a message that says which; the pool keeps serving after each stop and after
a process dies on its own. Its queue: small compiles first, costly ones on all but one
process and bounded. One pool serves the module (its processes are forked once)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future, wait
from typing import Any

import pytest

from radixmesh.errors import Internal, Overloaded
from radixmesh.tokenizer import Tokenizer
from radixmesh.worker.constrained.compile_pool import CompileLimits, CompilePool
from radixmesh.worker.constrained.cost import COSTLY_WEIGHT
from radixmesh.worker.constrained.grammar import CompileStopped, GrammarError
from radixmesh.worker.constrained.registry import create_grammar_backend
from radixmesh.worker.constrained.vocab import vocab_of
from tests.worker.constrained.compilers import SPEC
from tests.worker.constrained.conftest import EOS, VOCAB

LIMITS = CompileLimits(timeout=1.5, memory_bytes=256 << 20, processes=2, cpu_seconds=1)


@pytest.fixture(scope="module")
def pool() -> Iterator[CompilePool]:
    p = CompilePool(SPEC, LIMITS)
    p.start()
    yield p
    p.shutdown()


def _error(pool: CompilePool, kind: str, text: str) -> GrammarError:
    with pytest.raises(GrammarError) as e:
        pool.submit(kind, text).result(timeout=30)
    return e.value


def test_results_and_compiler_errors_come_back(pool: CompilePool) -> None:
    assert pool.submit("regex", "echo:hello").result(timeout=30) == "hello"
    error = _error(pool, "regex", "fail:unclosed '['")
    assert type(error) is GrammarError and str(error) == "unclosed '['"


def test_a_compile_past_its_time_is_stopped_and_the_pool_serves_on(pool: CompilePool) -> None:
    before = pool.stopped
    t0 = time.monotonic()
    error = _error(pool, "regex", "sleep:60")
    assert isinstance(error, CompileStopped)
    assert str(error) == "did not compile within 1.5 s (the compile was stopped)"
    assert time.monotonic() - t0 < 10  # stopped, not waited for
    assert pool.stopped == before + 1
    assert pool.submit("regex", "echo:after").result(timeout=30) == "after"


def test_cpu_time_is_capped(pool: CompilePool) -> None:
    # A wall-clock timeout of 1.5 s with a CPU cap of 1 s: spinning 1.4 s of CPU and more
    # hits the cap first on an idle machine; on a busy one the timeout stops it. Either
    # way it is stopped, and the pool serves on.
    error = _error(pool, "regex", "spin:30")
    assert isinstance(error, CompileStopped)
    assert str(error) in (
        "stopped the compiler process: it used up its CPU-time limit",
        "did not compile within 1.5 s (the compile was stopped)",
    )
    assert pool.submit("regex", "echo:after").result(timeout=30) == "after"


def test_memory_is_capped(pool: CompilePool) -> None:
    small = pool.submit("regex", f"allocate:{64 << 20}")
    assert small.result(timeout=30) == f"allocated {64 << 20}"
    error = _error(pool, "regex", f"allocate:{1 << 30}")
    assert isinstance(error, CompileStopped)
    assert str(error) == "needed more than 256 MiB to compile"
    assert pool.submit("regex", "echo:after").result(timeout=30) == "after"


def test_a_process_that_dies_idle_is_replaced(pool: CompilePool) -> None:
    pids = {pool.submit("regex", "echo:x") for _ in range(2)}  # both processes started
    for f in pids:
        f.result(timeout=30)
    inner = pool._pool
    assert inner is not None
    for pid in list(inner._pool_manager.worker_manager.workers):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:  # the pool notices, gives up on itself, and the next submit replaces it
        try:
            assert pool.submit("regex", "echo:again").result(timeout=30) == "again"
            break
        except Internal as e:  # the server's failure, never the constraint's
            assert "compile processes could not start or stopped" in str(e)
            assert time.monotonic() < deadline
            time.sleep(0.2)


def _record(order: list[str], label: str, f: Future[Any]) -> Future[Any]:
    f.add_done_callback(lambda _: order.append(label))
    return f


def test_small_compiles_go_first_and_costly_ones_cheapest_first(pool: CompilePool) -> None:
    order: list[str] = []
    costly = [
        _record(order, label, pool.submit("regex", "sleep:0.6", COSTLY_WEIGHT + extra))
        for label, extra in (("c1", 3), ("c2", 2), ("c3", 1))
    ]
    t0 = time.monotonic()
    small = _record(order, "small", pool.submit("regex", "echo:small", 0))
    assert small.result(timeout=30) == "small"
    took = time.monotonic() - t0
    wait(costly, timeout=30)
    # One process is left to small compiles: it did not wait for c1 (running), and the
    # costly ones ran one at a time, the cheapest waiting one first.
    assert order == ["small", "c1", "c3", "c2"]
    assert took < 0.5, took


def test_costly_compiles_past_the_bound_are_overloaded(pool: CompilePool) -> None:
    running = [pool.submit("regex", "sleep:0.3", COSTLY_WEIGHT) for _ in range(4)]
    with pytest.raises(Overloaded) as e:
        pool.submit("regex", "echo:fifth", COSTLY_WEIGHT)
    assert str(e.value) == (
        "4 costly grammar compiles are running or waiting on this worker (at most 4)"
    )
    assert e.value.retry_after == LIMITS.timeout
    assert pool.submit("regex", "echo:small", 0).result(timeout=30) == "small"
    wait(running, timeout=30)
    assert pool.submit("regex", "echo:costly", COSTLY_WEIGHT).result(timeout=30) == "costly"


def test_small_compiles_do_not_starve_a_costly_one(pool: CompilePool) -> None:
    order: list[str] = []
    first = pool.submit("regex", "sleep:0.4", COSTLY_WEIGHT)
    second = _record(order, "costly", pool.submit("regex", "sleep:0.4", COSTLY_WEIGHT))
    smalls = [_record(order, "small", pool.submit("regex", "sleep:0.1", 0)) for _ in range(16)]
    wait([first, second, *smalls], timeout=60)
    # The second costly one took the first's process when it ended, ahead of the smalls
    # still waiting (they had the other process: ~1.6 s of them).
    assert order.index("costly") < len(order) - 4, order


def test_xgrammar_and_outlines_grammars_cross_the_process_boundary(tok: Tokenizer) -> None:
    vocab = vocab_of(tok, VOCAB, [EOS])
    assert vocab is not None
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
    # xgrammar's compact JSON keeps a space after the colon; outlines' has no whitespace.
    for name, text in (("xgrammar", '{"a": 12}'), ("outlines", '{"a":12}')):
        backend = create_grammar_backend(name, vocab)
        p = CompilePool(backend.compiler_spec(), CompileLimits(30, 1 << 30, processes=1))
        try:
            compiled = backend.load(p.submit("json_schema", schema).result(timeout=60))
            m = backend.matcher(compiled)
            for t in tok.encode(text):
                assert m.accept_token(t), (name, t)
            assert m.accept_token(EOS) and m.is_terminated()
            error = _error(p, "regex", "[0-9")
            assert type(error) is GrammarError and str(error)  # the compiler's own words
        finally:
            p.shutdown()
