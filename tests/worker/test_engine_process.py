"""The engine in a child process (worker/engine_process.py) against the in-process engine:
same tokens, same errors, aborts that free their KV, cache events in order, a dead child
that fails every stream."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.worker.engine import Engine
from radixmesh.worker.engine_process import EngineProcess
from radixmesh.worker.kvcache.events import CacheEvent

OPTIONS: dict[str, Any] = {"model": "smollm2", "device": "cpu", "kv_cache_tokens": 4096}
GREEDY = {"max_new_tokens": 12, "temperature": 0.0}


@pytest.fixture(scope="module")
def proc() -> Iterator[EngineProcess]:
    p = EngineProcess(OPTIONS)
    yield p
    p.shutdown()


def _stream(p: EngineProcess, ids: list[int], params: dict[str, Any]) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        return [c.as_chunk() async for c in p.async_stream(ids, params)]

    return asyncio.run(run())


def test_same_tokens_as_the_in_process_engine(proc: EngineProcess) -> None:
    prompt = "The capital of France is"
    ids = proc.tokenizer.encode(prompt)
    chunks = _stream(proc, ids, GREEDY)
    with Engine(**OPTIONS) as engine:
        want = engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert isinstance(want, dict)
    assert [t for c in chunks for t in c["output_ids"]] == want["output_ids"]
    assert "".join(c["text"] for c in chunks) == want["text"]
    last = chunks[-1]["meta_info"]
    assert last["finish_reason"] == {"type": "length", "length": 12}
    assert (last["prompt_tokens"], last["completion_tokens"]) == (len(ids), 12)
    assert proc.info.vocab_size == 49152 and proc.info.eos_ids == frozenset({2})
    assert proc.config.scheduler.max_running_requests == 64  # resolved in the child


def test_embeddings_come_back_from_the_child(proc: EngineProcess) -> None:
    ids = proc.tokenizer.encode("Embeddings cross the pipe too.")
    mean = asyncio.run(proc.async_encode(ids))
    last = asyncio.run(proc.async_encode(ids, "last"))
    assert mean.embedding is not None and last.embedding is not None
    assert proc.info.hidden_size == len(mean.embedding) == len(last.embedding) == 576
    assert mean.embedding != last.embedding
    assert mean.meta_info.prompt_tokens == len(ids)
    with pytest.raises(InvalidArgument) as e:
        asyncio.run(proc.async_encode(ids, "max"))
    assert e.value.field == "pooling"


def test_bad_requests_raise_their_error_naming_the_field(proc: EngineProcess) -> None:
    with pytest.raises(InvalidArgument) as e:
        _stream(proc, [1, 2, 3], {"max_new_tokens": -1})
    assert e.value.field == "max_new_tokens"
    with pytest.raises(InvalidArgument) as e:
        _stream(proc, [1, 49152], GREEDY)
    assert e.value.field == "input_ids"
    with pytest.raises(InvalidArgument) as e:  # not a plain value: the pipe can't carry it
        _stream(proc, [1, 2, 3], {"max_new_tokens": 2, "temperature": object()})
    assert e.value.field == "temperature"
    assert _stream(proc, [1, 2, 3], {"max_new_tokens": 2})[-1]["meta_info"]["finish_reason"]


def test_a_stream_closed_early_is_aborted_and_frees_its_kv(proc: EngineProcess) -> None:
    async def run() -> int:
        stream = proc.async_stream([5] * 40, {"max_new_tokens": 400, "ignore_eos": True})
        got = 0
        async for c in stream:
            got += len(c.new_token_ids)
            if got >= 3:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        return got

    assert asyncio.run(run()) >= 3
    deadline = time.monotonic() + 10
    while (stats := proc.get_stats()).num_running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (stats.num_running, stats.num_waiting) == (0, 0)
    assert stats.kv_slots_used == stats.cache_size  # only what the tree holds
    assert proc.flush_cache() is True
    assert proc.get_stats().kv_slots_used == 0


def test_cache_events_come_in_order_and_the_snapshot_is_stamped(proc: EngineProcess) -> None:
    events: list[CacheEvent] = []
    proc.add_cache_listener(events.append)
    assert proc.flush_cache() is True
    ids = proc.tokenizer.encode("Radix trees share prefixes between requests. " * 6)
    _stream(proc, ids, {"max_new_tokens": 4})
    count, snapshot = proc.cache_snapshot(lambda: len(events))
    stored = [h for e in events[:count] if e.kind == "stored" for h in e.block_hashes]
    assert events[0].kind == "cleared"
    assert len(stored) == len(ids) // 16  # the prompt's whole 16-token blocks
    assert [h for e in snapshot for h in e.block_hashes] == stored


def test_score_matches_the_in_process_engine(proc: EngineProcess) -> None:
    ids = proc.tokenizer.encode("The capital of France is")
    conts = [proc.tokenizer.encode(" Paris"), proc.tokenizer.encode(" Rome")]
    got = asyncio.run(proc.async_score(ids, conts))
    with Engine(**OPTIONS) as engine:
        want = asyncio.run(engine.async_score(ids, conts))
    # Same model and tokens; the prompt may be cached in one and not the other: fp32 noise.
    assert [x for g in got for x in g] == pytest.approx([x for w in want for x in w], abs=1e-4)
    assert len(got[0]) == len(conts[0]) and got[0][0] > got[1][0]


def test_a_dead_child_fails_streams_and_calls() -> None:
    p = EngineProcess({"model": "dummy:tiny", "device": "cpu"})
    try:

        async def run() -> None:
            stream = p.async_stream([3] * 8, {"max_new_tokens": 2000, "ignore_eos": True})
            async for _ in stream:
                assert p._proc.pid is not None
                os.kill(p._proc.pid, signal.SIGKILL)

        with pytest.raises(Unavailable, match="engine process exited"):
            asyncio.run(run())
        assert p.fatal is not None
        with pytest.raises(Unavailable):
            p.get_stats()
    finally:
        p.shutdown()
