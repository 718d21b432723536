"""The Engine on the bundled SmolLM2-135M-Instruct: API shape, caching, sampling, streaming."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from radixmesh.worker.request import Request, RequestOutput
from tests.worker.conftest import assert_engine_idle_and_clean

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0, "max_new_tokens": 16}

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "Water boils at a temperature of",
    "The largest planet in the solar system is",
    "import numpy as np\n",
]


def _chat(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode_chat([{"role": "user", "content": text}])


def test_answers_paris_with_the_chat_template(engine: Engine) -> None:
    ids = _chat(engine, "What is the capital of France? Answer in one word.")
    out = engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert isinstance(out, dict)
    assert "Paris" in out["text"]
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(ids)
    assert meta["completion_tokens"] == len(out["output_ids"])
    assert meta["finish_reason"]["type"] == "stop"  # the model ends its turn
    assert_engine_idle_and_clean(engine)


def test_cache_on_and_off_give_identical_greedy_tokens(engine: Engine) -> None:
    engine.flush_cache()
    first = engine.generate(PROMPTS, GREEDY)
    again = engine.generate(PROMPTS, GREEDY)  # every prompt is now (almost) fully cached
    assert isinstance(first, list) and isinstance(again, list)
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in first]
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in again)
    off = Engine("smollm2", dtype="float32", disable_radix_cache=True, kv_cache_tokens=4096)
    try:
        nocache = off.generate(PROMPTS, GREEDY)
        assert isinstance(nocache, list)
        assert [o["output_ids"] for o in nocache] == [o["output_ids"] for o in first]
        assert all(o["meta_info"]["cached_tokens"] == 0 for o in nocache)
    finally:
        off.shutdown()
    assert_engine_idle_and_clean(engine)


def test_shared_prefix_is_cached_for_the_second_request(engine: Engine) -> None:
    engine.flush_cache()
    system = "You are a helpful assistant who answers briefly and precisely. " * 4
    a = engine.tokenizer.encode_chat(
        [{"role": "system", "content": system}, {"role": "user", "content": "Name a fruit."}]
    )
    b = engine.tokenizer.encode_chat(
        [{"role": "system", "content": system}, {"role": "user", "content": "Name a color."}]
    )
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    out_a = engine.generate(input_ids=a, sampling_params=GREEDY)
    out_b = engine.generate(input_ids=b, sampling_params=GREEDY)
    assert isinstance(out_a, dict) and isinstance(out_b, dict)
    assert out_a["meta_info"]["cached_tokens"] == 0
    assert out_b["meta_info"]["cached_tokens"] == common


def test_next_chat_turn_reuses_prompt_and_generated_tokens(engine: Engine) -> None:
    engine.flush_cache()
    msgs = [{"role": "user", "content": "Say hello in French."}]
    ids = engine.tokenizer.encode_chat(msgs)
    first = engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert isinstance(first, dict)
    msgs += [
        {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": "And in Spanish?"},
    ]
    second = engine.generate(input_ids=engine.tokenizer.encode_chat(msgs), sampling_params=GREEDY)
    assert isinstance(second, dict)
    # The whole first turn, its answer included, came from the cache.
    assert second["meta_info"]["cached_tokens"] >= len(ids) + len(first["output_ids"]) - 1


def test_stream_deltas_concatenate_to_the_full_result(engine: Engine) -> None:
    params = {"temperature": 0.0, "max_new_tokens": 24}
    full = engine.generate(PROMPTS[2], params)
    stream = engine.generate(PROMPTS[2], params, stream=True)
    assert isinstance(stream, Iterator)
    chunks = list(stream)
    assert isinstance(full, dict)
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert [t for c in chunks for t in c["output_ids"]] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]
    assert len(chunks) > 1


def test_a_whole_result_reaches_its_caller_as_one_output(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """generate and async_generate without streaming: each request's sink gets one output,
    when it ends (no output per step), and it holds what the stream's deltas add up to."""
    calls: dict[str, list[bool]] = {}
    enqueue, enqueue_all = engine._enqueue, engine._enqueue_all

    def count_outputs(req: Request) -> None:
        sink, seen = req.sink, calls.setdefault(req.rid, [])
        assert sink is not None

        def count(out: RequestOutput) -> None:
            seen.append(out.finished)
            sink(out)

        req.sink = count

    def counting(req: Request, **kw: bool) -> None:  # a stream's request
        count_outputs(req)
        enqueue(req, **kw)

    def counting_all(reqs: list[Request]) -> None:  # a call's requests, in one message
        for req in reqs:
            count_outputs(req)
        enqueue_all(reqs)

    monkeypatch.setattr(engine, "_enqueue", counting)
    monkeypatch.setattr(engine, "_enqueue_all", counting_all)
    params = {"temperature": 0.0, "max_new_tokens": 24}
    whole = engine.generate(PROMPTS[:3], params)
    assert isinstance(whole, list) and len(calls) == 3
    assert all(seen == [True] for seen in calls.values())
    calls.clear()
    awaited = asyncio.run(engine.async_generate(PROMPTS[2], params))
    assert isinstance(awaited, dict) and list(calls.values()) == [[True]]
    calls.clear()
    stream = engine.generate(PROMPTS[2], params, stream=True)
    assert isinstance(stream, Iterator)
    chunks = list(stream)
    assert [len(seen) for seen in calls.values()] == [len(chunks)] and len(chunks) > 1
    assert "".join(c["text"] for c in chunks) == whole[2]["text"] == awaited["text"]
    assert [t for c in chunks for t in c["output_ids"]] == whole[2]["output_ids"]
    assert_engine_idle_and_clean(engine)


def test_closing_a_stream_early_aborts_and_frees(engine: Engine) -> None:
    stream = engine.generate(PROMPTS[2], {"max_new_tokens": 200, "ignore_eos": True}, stream=True)
    assert isinstance(stream, Iterator)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    engine.call(lambda: None)  # the abort is processed before this returns
    assert_engine_idle_and_clean(engine)


def test_async_generate_runs_concurrently(engine: Engine) -> None:
    async def main() -> list[object]:
        return list(await asyncio.gather(*(engine.async_generate(p, GREEDY) for p in PROMPTS[:4])))

    results = asyncio.run(main())
    sync = engine.generate(PROMPTS[:4], GREEDY)
    assert isinstance(sync, list)
    assert [r["output_ids"] for r in results] == [s["output_ids"] for s in sync]  # type: ignore[index]


def test_stop_string_spanning_tokens_trims_exactly(engine: Engine) -> None:
    base = engine.generate(PROMPTS[2], {"temperature": 0.0, "max_new_tokens": 32})
    assert isinstance(base, dict)
    text = base["text"]
    stop = text[10:18]  # 8 characters from the middle: spans several tokens
    assert stop.strip() and text.index(stop) == 10
    out = engine.generate(PROMPTS[2], {"temperature": 0.0, "max_new_tokens": 32, "stop": [stop]})
    assert isinstance(out, dict)
    assert out["text"] == text[:10]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    kept = engine.generate(
        PROMPTS[2], {"temperature": 0.0, "max_new_tokens": 32, "stop": [stop], "no_stop_trim": True}
    )
    assert isinstance(kept, dict)
    assert kept["text"] == text[:18]


def test_stop_token_ids_and_min_new_tokens(engine: Engine) -> None:
    base = engine.generate(
        PROMPTS[0], {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
    )
    assert isinstance(base, dict)
    ids = base["output_ids"]
    stop_at = ids[3]
    first = ids.index(stop_at)
    out = engine.generate(
        PROMPTS[0], {"temperature": 0.0, "max_new_tokens": 12, "stop_token_ids": [stop_at]}
    )
    assert isinstance(out, dict)
    assert out["output_ids"] == ids[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}
    longer = engine.generate(
        PROMPTS[0],
        {
            "temperature": 0.0,
            "max_new_tokens": 12,
            "stop_token_ids": [stop_at],
            "min_new_tokens": 12,
        },
    )
    assert isinstance(longer, dict)
    assert len(longer["output_ids"]) == 12
    assert stop_at not in longer["output_ids"]  # banned while below min_new_tokens


def test_length_finish_and_max_new_tokens(engine: Engine) -> None:
    out = engine.generate(PROMPTS[1], {"max_new_tokens": 5, "ignore_eos": True})
    assert isinstance(out, dict)
    assert len(out["output_ids"]) == 5
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def test_seeded_sampling_is_reproducible_and_n_copies_share_the_prompt(engine: Engine) -> None:
    engine.flush_cache()
    params = {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 12, "seed": 7}
    a = engine.generate(PROMPTS[2], params)
    b = engine.generate([*PROMPTS[3:5], PROMPTS[2]], params)
    assert isinstance(a, dict) and isinstance(b, list)
    assert b[2]["output_ids"] == a["output_ids"]
    engine.flush_cache()
    long_prompt = PROMPTS[2] + " " + " ".join(PROMPTS) * 2
    outs = engine.generate(long_prompt, {"temperature": 1.0, "max_new_tokens": 8, "n": 4})
    assert isinstance(outs, list) and len(outs) == 4
    cached = sorted(o["meta_info"]["cached_tokens"] for o in outs)
    assert cached[0] == 0 and all(c > 32 for c in cached[1:])
    assert len({tuple(o["output_ids"]) for o in outs}) > 1  # unseeded copies differ


def test_logprobs_and_prompt_logprobs_match_transformers(
    engine: Engine, hf_smollm2: object
) -> None:
    import torch

    ids = engine.tokenizer.encode(PROMPTS[4])
    out = engine.generate(
        input_ids=ids,
        sampling_params={
            "temperature": 0.0,
            "max_new_tokens": 4,
            "return_logprob": True,
            "logprob_start_len": 2,
            "top_logprobs_num": 3,
        },
    )
    assert isinstance(out, dict)
    meta = out["meta_info"]
    full = torch.tensor([ids + out["output_ids"]])
    with torch.no_grad():
        ref = torch.log_softmax(hf_smollm2(full).logits[0].float(), dim=-1)  # type: ignore[operator]
    inp = meta["input_token_logprobs"]
    assert [t for _, t, _ in inp] == ids[2:]
    for k, (lp, tok, _) in enumerate(inp):
        assert lp == pytest.approx(ref[2 + k - 1, tok].item(), abs=2e-3)
    outp = meta["output_token_logprobs"]
    assert [t for _, t, _ in outp] == out["output_ids"]
    for k, (lp, tok, _) in enumerate(outp):
        assert lp == pytest.approx(ref[len(ids) - 1 + k, tok].item(), abs=2e-3)
    top = meta["output_top_logprobs"][0]
    assert len(top) == 3 and top[0][1] == out["output_ids"][0]  # greedy = the top token
    assert [lp for lp, _, _ in top] == sorted((lp for lp, _, _ in top), reverse=True)
    assert_engine_idle_and_clean(engine)


def test_encode_pools_the_final_hidden_states_of_transformers(
    engine: Engine, hf_smollm2: object
) -> None:
    """Mean and last pooling equal transformers' last_hidden_state on the same weights,
    also when the prompt's start is cached (mean pooling recomputes it)."""
    import torch

    ids = engine.tokenizer.encode(PROMPTS[3] + " " + PROMPTS[4])
    engine.generate(input_ids=ids[:12], sampling_params={"max_new_tokens": 1})  # cache a prefix
    with torch.no_grad():
        ref = hf_smollm2.model(torch.tensor([ids])).last_hidden_state[0]  # type: ignore[attr-defined]
    for pooling, expected in (("mean", ref.mean(dim=0)), ("last", ref[-1])):
        out = engine.encode(input_ids=ids, pooling=pooling)
        assert isinstance(out, dict)
        got = torch.tensor(out["embedding"])
        assert got.shape == (576,)
        assert torch.allclose(got, expected, atol=1e-4), (pooling, (got - expected).abs().max())
        assert out["meta_info"]["prompt_tokens"] == len(ids)
        assert out["meta_info"]["completion_tokens"] == 0
    cached = engine.encode(input_ids=ids, pooling="last")
    assert isinstance(cached, dict) and cached["meta_info"]["cached_tokens"] > 0
    batch = engine.encode([PROMPTS[0], PROMPTS[1]])
    assert isinstance(batch, list) and len(batch) == 2
    with pytest.raises(InvalidArgument, match="pooling"):
        engine.encode(PROMPTS[0], pooling="max")
    assert_engine_idle_and_clean(engine)


def test_bfloat16_engine_answers_and_shares_the_cache() -> None:
    """bf16 on CPU is a speed mode (packed oneDNN bf16 GEMMs): answers stay right."""
    eng = Engine("smollm2", dtype="bfloat16", kv_cache_tokens=2048)
    try:
        ids = eng.tokenizer.encode_chat(
            [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        )
        outs = eng.generate(input_ids=[ids, ids], sampling_params=GREEDY)
        assert isinstance(outs, list)
        assert all("Paris" in o["text"] for o in outs)
        assert outs[1]["meta_info"]["cached_tokens"] == len(ids) - 1
    finally:
        eng.shutdown()


def test_eos_token_is_in_output_ids_but_not_in_the_text(engine: Engine) -> None:
    ids = _chat(engine, "What is the capital of France? Answer in one word.")
    params = {**GREEDY, "skip_special_tokens": False}
    out = engine.generate(input_ids=ids, sampling_params=params)
    kept = engine.generate(input_ids=ids, sampling_params={**params, "no_stop_trim": True})
    assert isinstance(out, dict) and isinstance(kept, dict)
    eos = out["meta_info"]["finish_reason"]["matched"]
    assert out["output_ids"][-1] == eos
    eos_text = engine.tokenizer.decode([eos], skip_special_tokens=False)
    assert eos_text and not out["text"].endswith(eos_text)
    assert kept["text"] == out["text"] + eos_text


def test_a_dead_scheduler_thread_fails_waiters_instead_of_hanging() -> None:
    from radixmesh.errors import Unavailable

    eng = Engine("dummy:tiny", dtype="float32", kv_cache_tokens=256)
    try:

        def explode(reason: str) -> None:
            raise SystemExit("device gone")  # not an Exception: escapes the step guard

        def bad_step() -> list[Request]:
            raise RuntimeError("step failed")

        eng.worker.scheduler.fail_all = explode  # type: ignore[method-assign]
        eng.worker.scheduler.step = bad_step  # type: ignore[method-assign]
        with pytest.raises(Unavailable, match="scheduler stopped: SystemExit: device gone"):
            eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
        with pytest.raises(Unavailable, match="device gone"):
            eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    finally:
        eng.shutdown()


def test_default_dtype_keeps_greedy_answers_exact_across_cache_hits() -> None:
    """A near-tie prompt (top-2 logprob gap 0.08): bf16 flips it on a cache hit, the
    default (float32 on CPU) must not."""
    eng = Engine("smollm2", kv_cache_tokens=2048)
    try:
        assert eng.worker.dtype.is_floating_point and eng.worker.dtype.itemsize == 4
        ids = eng.tokenizer.encode_chat(
            [{"role": "user", "content": "What is the capital of France?"}]
        )
        first = eng.generate(input_ids=ids, sampling_params=GREEDY)
        again = eng.generate(input_ids=ids, sampling_params=GREEDY)
        assert isinstance(first, dict) and isinstance(again, dict)
        assert again["meta_info"]["cached_tokens"] == len(ids) - 1
        assert again["output_ids"] == first["output_ids"]
    finally:
        eng.shutdown()


def test_shutdown_gives_back_the_model_and_kv_pool_while_the_engine_is_still_held() -> None:
    import weakref

    from radixmesh.errors import Unavailable

    eng = Engine("dummy:tiny", dtype="float32", kv_cache_tokens=256)
    eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    held: list[weakref.ref[object]] = [
        weakref.ref(eng.worker.kv_pool.k_buffers[0]),
        weakref.ref(next(eng.worker.model.parameters())),
        weakref.ref(eng.worker.req_table),
        weakref.ref(eng.worker.scheduler),
    ]
    eng.shutdown()
    gc.collect()
    assert [ref() is None for ref in held] == [True] * len(held)
    with pytest.raises(Unavailable, match="shut down"):
        eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    with pytest.raises(Unavailable, match="shut down"):
        eng.get_stats()
    eng.shutdown()  # twice is fine


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_two_engines_in_turn_each_take_the_whole_gpu() -> None:
    """Each auto-sizes its KV pool to most of the free memory: the second fits only if
    the first's shutdown gave everything back. Counted from what the process held before
    (tests run earlier in the same process may keep tensors of their own)."""
    gc.collect()
    before = torch.cuda.memory_allocated()
    left = []
    for _ in range(2):
        eng = Engine("dummy:llama-3-8b", cuda_graph_max_batch_size=8)
        eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
        eng.shutdown()
        left.append(torch.cuda.memory_allocated() - before)
    assert left[0] < 1 << 30 and left[1] < 1 << 30, left
