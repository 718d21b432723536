"""The host-memory KV tier in the engine, on the bundled SmolLM2 (float32, CPU): a small
device pool whose conversations move to host memory and come back, with the same tokens
as recomputing them, and every device and host slot accounted for after aborts."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from tests.worker.conftest import assert_engine_idle_and_clean

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0, "max_new_tokens": 12}
TOPICS = ["rivers", "volcanoes", "libraries", "bicycles"]
DEVICE_TOKENS = 512
HOST_TOKENS = 2048
BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M: K and V, 30 layers, 3 KV heads, float32


def _system(topic: str) -> str:
    return (
        f"You are a patient teacher of {topic}. Answer every question about {topic} in "
        "one short sentence, plainly, without lists. " * 6
    )


def _turn(engine: Engine, history: list[dict[str, str]], question: str) -> list[int]:
    return engine.tokenizer.encode_chat([*history, {"role": "user", "content": question}])


def _conversations(engine: Engine) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Turn 1 of each conversation, one after another (each pushes the others off the
    device), then turn 2 of each: the outputs of both turns."""
    first, second = [], []
    histories = {t: [{"role": "system", "content": _system(t)}] for t in TOPICS}
    for t in TOPICS:
        out = engine.generate(
            input_ids=_turn(engine, histories[t], f"What are {t}?"), sampling_params=GREEDY
        )
        assert isinstance(out, dict)
        first.append(out)
        histories[t] = [
            *histories[t],
            {"role": "user", "content": f"What are {t}?"},
            {"role": "assistant", "content": out["text"]},
        ]
    for t in TOPICS:
        out = engine.generate(
            input_ids=_turn(engine, histories[t], "Why do they matter?"), sampling_params=GREEDY
        )
        assert isinstance(out, dict)
        second.append(out)
    return first, second


def assert_host_tier_clean(engine: Engine) -> None:
    def check() -> None:
        w = engine.worker
        tier = w.cache.tier
        assert tier is not None
        a = tier.allocator
        assert a.num_free_slots + w.cache.host_size() == a.num_usable_slots

    engine.call(check)


@pytest.fixture(scope="module")
def tiered() -> Iterator[Engine]:
    eng = Engine(
        "smollm2",
        dtype="float32",
        kv_cache_tokens=DEVICE_TOKENS,
        host_kv_cache_bytes=(HOST_TOKENS + 1) * BYTES_PER_TOKEN,
        max_running_requests=4,
    )
    yield eng
    eng.shutdown()


def test_conversations_come_back_from_host_memory_with_the_same_tokens(tiered: Engine) -> None:
    tiered.flush_cache()
    first, second = _conversations(tiered)
    stats = tiered.get_stats()
    assert stats.host_kv_slots_total == HOST_TOKENS
    assert stats.host_cache_hit_tokens > 0 and stats.host_kv_bytes_loaded > 0
    # Turn 2 finds turn 1's prompt cached: most of it reloaded from host memory.
    for a, b in zip(first, second, strict=True):
        meta_a, meta_b = a["meta_info"], b["meta_info"]
        assert isinstance(meta_a, dict) and isinstance(meta_b, dict)
        assert meta_b["cached_tokens"] >= meta_a["prompt_tokens"]
    plain = Engine(
        "smollm2", dtype="float32", kv_cache_tokens=DEVICE_TOKENS, max_running_requests=4
    )
    try:
        first_plain, second_plain = _conversations(plain)
        # Without the tier the device pool keeps only the latest conversation.
        cached_plain = sum(o["meta_info"]["cached_tokens"] for o in second_plain)  # type: ignore[index]
        cached_tier = sum(o["meta_info"]["cached_tokens"] for o in second)  # type: ignore[index]
        assert cached_tier > 2 * cached_plain
        assert [o["output_ids"] for o in first_plain] == [o["output_ids"] for o in first]
        assert [o["output_ids"] for o in second_plain] == [o["output_ids"] for o in second]
    finally:
        plain.shutdown()
    assert_engine_idle_and_clean(tiered)
    assert_host_tier_clean(tiered)


def test_aborts_and_flush_leave_every_slot_accounted(tiered: Engine) -> None:
    tiered.flush_cache()
    _conversations(tiered)  # fills host memory
    prompts = [
        _turn(tiered, [{"role": "system", "content": _system(t)}], "Tell me more.") for t in TOPICS
    ]
    streams = [
        tiered.generate(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 64}, stream=True)
        for p in prompts
    ]
    for s in streams:
        next(iter(s))  # started: its prefix reloaded
    for s in streams[::2]:
        s.close()  # type: ignore[union-attr]  # abort mid-decode
    for s in streams[1::2]:
        list(s)
    assert_engine_idle_and_clean(tiered)
    assert_host_tier_clean(tiered)
    assert tiered.flush_cache()
    stats = tiered.get_stats()
    assert stats.host_kv_slots_used == 0 and stats.cache_size == 0


def test_bad_host_size_names_the_field() -> None:
    with pytest.raises(InvalidArgument, match="host_kv_cache_bytes"):
        Engine("smollm2", dtype="float32", kv_cache_tokens=64, host_kv_cache_bytes=-1)
    with pytest.raises(InvalidArgument, match="host_kv_cache_bytes"):
        Engine("smollm2", dtype="float32", kv_cache_tokens=64, host_kv_cache_bytes=1000)


def test_stress_reloads_aborts_and_disconnects_lose_no_slot(tiered: Engine) -> None:
    """Conversations that reload from host memory, clients that leave mid-stream, aborts
    by id and rejected requests, all at once: afterwards every device slot is free or in
    the tree, every host slot free or held by a node, and a flush frees them all."""
    tiered.flush_cache()
    rng = random.Random(7)
    systems = [engine_ids(tiered, _system(t)) for t in TOPICS]

    async def one(i: int) -> None:
        ids = systems[i % len(systems)] + [rng.randrange(100, 2000) for _ in range(8)]
        params = {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}
        if i % 7 == 3:  # a bad request is refused before it takes anything
            with pytest.raises(InvalidArgument, match="max_new_tokens"):
                await tiered.async_generate(input_ids=ids, sampling_params={"max_new_tokens": -1})
            return
        stream = await tiered.async_generate(input_ids=ids, sampling_params=params, stream=True)
        assert not isinstance(stream, (dict, list))
        leave_after = (0, 2, 5, None)[i % 4]
        n = 0
        async for _ in stream:
            n += 1
            if leave_after is not None and n > leave_after:
                await stream.aclose()  # type: ignore[attr-defined]  # the client disconnects
                break

    async def run() -> None:
        sem = asyncio.Semaphore(6)

        async def limited(i: int) -> None:
            async with sem:
                await one(i)

        await asyncio.gather(*(limited(i) for i in range(24)))

    asyncio.run(run())
    stats = tiered.get_stats()
    assert stats.host_kv_bytes_written > 0  # the device pool overflowed into host memory
    assert_engine_idle_and_clean(tiered)
    assert_host_tier_clean(tiered)
    assert tiered.flush_cache()
    stats = tiered.get_stats()
    assert stats.host_kv_slots_used == 0 and stats.cache_size == 0


def engine_ids(engine: Engine, system: str) -> list[int]:
    return engine.tokenizer.encode_chat([{"role": "system", "content": system}])


def _id_conversations(engine: Engine) -> tuple[list[list[int]], list[list[int]]]:
    """`_conversations` over token ids (a model without a tokenizer of its own): turn 1 of
    four conversations, then turn 2 of each; each turn's output ids."""
    rng = random.Random(3)
    histories = [[rng.randrange(100, 2000) for _ in range(300)] for _ in TOPICS]
    outs: list[list[list[int]]] = [[], []]
    for turn in range(2):
        for i in range(len(histories)):
            prompt = histories[i] + [rng.randrange(100, 2000) for _ in range(20)]
            out = engine.generate(input_ids=prompt, sampling_params=GREEDY)
            assert isinstance(out, dict)
            outs[turn].append(list(out["output_ids"]))
            histories[i] = prompt + outs[turn][-1]
    return outs[0], outs[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_reloads_give_the_device_cache_tokens() -> None:
    """bf16 on CUDA: turn 2 over a history reloaded from host memory (beside the forwards)
    gives the tokens turn 2 gives over the same history kept on the device."""
    # One context length: the decode kernels' launch depends on it (and a bf16 tie on it).
    common = {
        "device": "cuda",
        "dtype": "bfloat16",
        "max_running_requests": 4,
        "context_length": DEVICE_TOKENS,
    }
    small = Engine(
        "dummy:smollm2-135m",
        kv_cache_tokens=DEVICE_TOKENS,
        host_kv_cache_bytes=(HOST_TOKENS + 1) * BYTES_PER_TOKEN // 2,  # bf16: half of float32
        **common,
    )
    try:
        first, second = _id_conversations(small)
        stats = small.get_stats()
    finally:
        small.shutdown()
    big = Engine("dummy:smollm2-135m", kv_cache_tokens=8 * DEVICE_TOKENS, **common)
    try:
        first_big, second_big = _id_conversations(big)
        assert big.get_stats().host_cache_hit_tokens == 0
    finally:
        big.shutdown()
    assert stats.host_cache_hit_tokens >= 3 * 300  # three of four histories came back
    assert first == first_big
    assert second == second_big
