"""A compile bomb against the engine process a worker serves from (the bundled model's
tokenizer, xgrammar): a 1.4 KB JSON schema whose compile would run for minutes. It is
stopped at the compile timeout, its request gets INVALID_ARGUMENT naming the field, an
unconstrained request meanwhile is not held for the compile (slowed by less than half the
compile timeout, the CPU the compile takes included), and the worker's
memory does not grow with the compile (it runs in another process)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine_process import EngineProcess

pytestmark = pytest.mark.slow

TIMEOUT = 3.0
OPTIONS: dict[str, Any] = {
    "model": "smollm2",
    "device": "cpu",
    "kv_cache_tokens": 2048,
    "grammar_compile_timeout": TIMEOUT,
}
# Twenty properties whose pattern nests repetitions: xgrammar took 87 s for this one
# schema on this machine, almost all of it building token masks.
BOMB = json.dumps(
    {
        "type": "object",
        "properties": {
            f"key_{i}": {"type": "string", "pattern": "([a-z0-9]{1,50}-){1,50}"} for i in range(20)
        },
    }
)
PLAIN = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def proc(smollm2_gguf: object) -> Iterator[EngineProcess]:
    p = EngineProcess(OPTIONS)
    yield p
    p.shutdown()


async def _timed(p: EngineProcess, ids: list[int], params: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    async for _ in p.async_stream(ids, params):
        pass
    return time.perf_counter() - t0


def _engine_rss(p: EngineProcess) -> int:
    return int(psutil.Process(p._proc.pid).memory_info().rss)


def test_a_compile_bomb_is_stopped_and_delays_nothing(proc: EngineProcess) -> None:
    ids = proc.tokenizer.encode("Count: one, two,")

    async def run() -> tuple[list[float], list[float], BaseException | None, float]:
        # Warm: the compile processes start, and the plain request's shapes are seen.
        await _timed(proc, ids, {**PLAIN, "regex": "[0-9]+"})
        before = [await _timed(proc, ids, PLAIN) for _ in range(3)]
        t0 = time.perf_counter()
        bomb = asyncio.ensure_future(_timed(proc, ids, {**PLAIN, "json_schema": BOMB}))
        during = []
        while not bomb.done() and time.perf_counter() - t0 < 30:
            during.append(await _timed(proc, ids, PLAIN))
        error = None
        try:
            await bomb
        except BaseException as e:
            error = e
        return before, during, error, time.perf_counter() - t0

    rss = _engine_rss(proc)
    before, during, error, took = asyncio.run(run())
    assert isinstance(error, InvalidArgument), error
    assert error.field == "json_schema"
    assert error.message == (
        f"the JSON schema did not compile within {TIMEOUT:g} s (the compile was stopped)"
    )
    assert took < TIMEOUT + 5  # stopped at the timeout, not when the compile would end
    assert during, "no plain request ran while the bomb compiled"
    # A request held for the compile would wait all of TIMEOUT; the compile process's share
    # of a 2-core machine slows the others by ~1 s (1.71 s against 0.68 s seen once).
    assert max(during) < max(before) + TIMEOUT / 2, (before, during)
    assert _engine_rss(proc) - rss < 200 * 2**20  # the compile grew another process
    # The same bomb again fails at once (the failure is cached); others compile fine.
    t0 = time.perf_counter()

    async def again() -> None:
        with pytest.raises(InvalidArgument, match="did not compile within"):
            await _timed(proc, ids, {**PLAIN, "json_schema": BOMB})
        await _timed(proc, ids, {**PLAIN, "regex": "[a-z]+"})

    asyncio.run(again())
    assert time.perf_counter() - t0 < TIMEOUT
    print(f"plain request: {max(before):.3f} s alone, {max(during):.3f} s during the bomb")
