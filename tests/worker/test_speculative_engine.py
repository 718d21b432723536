"""Speculative decoding on the bundled SmolLM2 (its real weights, float32, CPU), against
the plain engine: the copy-heavy set's greedy outputs (text, stop strings, finish
reasons), the radix drafter on a repeated request, seeded sampling, streaming and an
abort mid-stream, constrained decoding, tensor parallelism."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from bench.sets.copy_heavy import TASKS
from radixmesh.worker.engine import Engine
from tests.worker.conftest import assert_engine_idle_and_clean

pytestmark = pytest.mark.slow

NEW_TOKENS = 40


@pytest.fixture(scope="module")
def ngram(smollm2_gguf: object) -> Iterator[Engine]:
    eng = Engine(
        "smollm2", dtype="float32", kv_cache_tokens=8192, max_running_requests=16,
        speculative="ngram",
    )  # fmt: skip
    yield eng
    eng.shutdown()


def _chat(eng: Engine, text: str) -> list[int]:
    return eng.tokenizer.encode_chat([{"role": "user", "content": text}])


def _spec_stats(eng: Engine) -> tuple[int, int, int]:
    s = eng.worker.scheduler.speculator
    assert s is not None
    return s.stats.verify_steps, s.stats.drafted_tokens, s.stats.accepted_tokens


def _params(i: int) -> dict[str, Any]:
    p: dict[str, Any] = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS}
    if i % 3 == 1:
        p["stop"] = [" the", "\n\n"]  # stop strings end some of them early
    if i % 4 == 2:
        p["max_new_tokens"] = 9
    return p


def test_copy_tasks_equal_plain_greedy(engine: Engine, ngram: Engine) -> None:
    """Batched (all tasks at once) through both engines: the same tokens, text and
    finish reasons; drafts were verified and most of them kept."""
    prompts = [_chat(ngram, t.prompt) for t in TASKS]
    params = [_params(i) for i in range(len(TASKS))]
    before = _spec_stats(ngram)
    fast = ngram.generate(input_ids=prompts, sampling_params=params)
    plain = engine.generate(input_ids=prompts, sampling_params=params)
    assert isinstance(fast, list) and isinstance(plain, list)
    for f, p in zip(fast, plain, strict=True):
        assert f["output_ids"] == p["output_ids"]
        assert f["text"] == p["text"]
        assert f["meta_info"]["finish_reason"] == p["meta_info"]["finish_reason"]
        assert f["meta_info"]["completion_tokens"] == p["meta_info"]["completion_tokens"]
    steps, drafted, accepted = (a - b for a, b in zip(_spec_stats(ngram), before, strict=True))
    assert steps > 0 and accepted > drafted // 4
    assert_engine_idle_and_clean(ngram)


def test_radix_drafts_a_repeated_request(smollm2_gguf: object) -> None:
    eng = Engine("smollm2", dtype="float32", kv_cache_tokens=8192, speculative="radix")
    try:
        ids = _chat(eng, "Write a short poem about a lighthouse keeper and the sea.")
        params = {"temperature": 0.0, "max_new_tokens": 48, "ignore_eos": True}
        first = eng.generate(input_ids=ids, sampling_params=params)
        before = _spec_stats(eng)
        second = eng.generate(input_ids=ids, sampling_params=params)
        assert isinstance(first, dict) and isinstance(second, dict)
        assert second["output_ids"] == first["output_ids"]
        steps, drafted, accepted = (a - b for a, b in zip(_spec_stats(eng), before, strict=True))
        # The first output, in the tree, drafts the second: (nearly) all of it is kept,
        # so the 47 tokens after the first took about 47 / 5 verify steps.
        assert accepted >= 0.9 * drafted and drafted >= 36
        assert steps <= 12
        assert_engine_idle_and_clean(eng)
    finally:
        eng.shutdown()


def test_seeded_sampling_repeats(ngram: Engine) -> None:
    ids = _chat(ngram, TASKS[0].prompt)

    def run(seed: int) -> list[int]:
        params = {"temperature": 0.7, "top_p": 0.9, "seed": seed, "max_new_tokens": 32}
        out = ngram.generate(input_ids=ids, sampling_params=params)
        assert isinstance(out, dict)
        return list(out["output_ids"])

    before = _spec_stats(ngram)
    a = run(11)
    assert _spec_stats(ngram)[0] > before[0]  # it drafted
    assert run(11) == a


def test_stream_and_abort(ngram: Engine) -> None:
    ids = _chat(ngram, TASKS[3].prompt)
    params = {"temperature": 0.0, "max_new_tokens": 48}
    full = ngram.generate(input_ids=ids, sampling_params=params)
    stream = ngram.generate(input_ids=ids, sampling_params=params, stream=True)
    assert isinstance(full, dict) and isinstance(stream, Iterator)
    chunks = list(stream)
    assert [t for c in chunks for t in c["output_ids"]] == full["output_ids"]
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert max(len(c["output_ids"]) for c in chunks) > 1  # a step added several tokens
    stream = ngram.generate(
        input_ids=ids, sampling_params={**params, "max_new_tokens": 400}, stream=True
    )
    assert isinstance(stream, Iterator)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    ngram.call(lambda: None)  # the abort is processed before this returns
    assert_engine_idle_and_clean(ngram)


def test_tensor_parallel_equals_plain() -> None:
    """dummy:tiny over two ranks (gloo): the verify rows' inputs reach the follower."""
    options = {"dtype": "float32", "kv_cache_tokens": 1024, "max_running_requests": 8}
    prompts = [[3 + (5 * i + j) % 7 for j in range(24)] for i in range(3)]  # repeats inside
    params = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}
    plain = Engine("dummy:tiny", tp_size=2, **options)
    try:
        want = plain.generate(input_ids=prompts, sampling_params=params)
    finally:
        plain.shutdown()
    eng = Engine("dummy:tiny", tp_size=2, speculative="ngram", **options)
    try:
        got = eng.generate(input_ids=prompts, sampling_params=params)
        assert isinstance(got, list) and isinstance(want, list)
        assert [g["output_ids"] for g in got] == [w["output_ids"] for w in want]
        assert _spec_stats(eng)[0] > 0
        assert_engine_idle_and_clean(eng)
    finally:
        eng.shutdown()


PEOPLE_SCHEMA = {
    "type": "array",
    "minItems": 4,
    "maxItems": 4,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "city": {"type": "string"},
            "description": {"type": "string"},
        },
        "required": ["name", "city", "description"],
    },
}


def test_constrained_drafts_follow_the_grammar(engine: Engine, ngram: Engine) -> None:
    """A JSON schema with long strings copied from the prompt: drafts are cut where the
    grammar forbids them and verified under its masks, jump-forward still appends the
    forced text: the same output as the plain engine, valid JSON, drafts kept."""

    ids = _chat(ngram, TASKS[9].prompt)  # the people task: descriptions copied verbatim
    params = {
        "temperature": 0.0,
        "max_new_tokens": 120,
        "json_schema": json.dumps(PEOPLE_SCHEMA),
    }
    before = _spec_stats(ngram)
    fast = ngram.generate(input_ids=ids, sampling_params=params)
    plain = engine.generate(input_ids=ids, sampling_params=params)
    assert isinstance(fast, dict) and isinstance(plain, dict)
    assert fast["output_ids"] == plain["output_ids"]
    assert fast["text"] == plain["text"]
    steps, _drafted, accepted = (a - b for a, b in zip(_spec_stats(ngram), before, strict=True))
    assert steps > 0 and accepted > 0
    assert fast["meta_info"]["forced_tokens"] > 0  # jump-forward ran beside the drafts
    if fast["meta_info"]["finish_reason"]["type"] == "stop":
        json.loads(fast["text"])
    assert_engine_idle_and_clean(ngram)
