"""Deterministic mode on the bundled SmolLM2-135M in bfloat16 on CPU (the dtype whose
greedy answers flip on cache hits without the mode: test_engine.py): a chat answered from
its cached prefix gives the cold answer's very bits; one prompt batched at other sizes,
and prompts over a cached shared prefix, give one output each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.deterministic import run_prefix, run_single
from radixmesh.worker.deterministic import DETERMINISTIC_BLOCK
from radixmesh.worker.engine import Engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    e = Engine("smollm2", dtype="bfloat16", deterministic=True, kv_cache_tokens=4096)
    yield e
    e.shutdown()


SYSTEM = (
    "You are a concise geography tutor. Answer every question in one short sentence, "
    "name the country and the city, and do not add greetings, lists or follow-up questions. "
    "When a question is ambiguous, answer the most common reading of it without asking back."
)


def test_a_chat_is_answered_the_same_from_the_cache(engine: Engine) -> None:
    ids = engine.tokenizer.encode_chat(
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "What is the capital of France?"},
        ]
    )
    params = {"temperature": 0.0, "max_new_tokens": 8, "return_logprob": True}
    engine.flush_cache()
    first = engine.generate(input_ids=ids, sampling_params=params)
    again = engine.generate(input_ids=ids, sampling_params=params)
    assert isinstance(first, dict) and isinstance(again, dict)
    cached = len(ids) - 1
    assert again["meta_info"]["cached_tokens"] == cached - cached % DETERMINISTIC_BLOCK > 0
    assert again["output_ids"] == first["output_ids"]
    lp = "output_token_logprobs"
    assert again["meta_info"][lp] == first["meta_info"][lp]


def test_batch_sizes_and_cached_prefixes_give_one_output(engine: Engine) -> None:
    vocab = engine.worker.arch.vocab_size
    assert run_single(engine, vocab, [1, 4], 1, 24, 4) == {"tokens": 1, "exact": 1}
    got = run_prefix(engine, vocab, [1, 70], 1, 4)
    assert (got["tokens"], got["exact"]) == (1, 1)
    assert [c["first_divergence"] for c in got["per_prefix"].values()] == [None, None]
