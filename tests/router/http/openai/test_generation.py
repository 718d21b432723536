"""Completions and chat completions on the bundled model through the `openai` client:
logit_bias, echo with prompt logprobs, usage (per choice, and on every streamed chunk)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.router.http.openai.conftest import MODEL, Smollm2Cluster

pytestmark = pytest.mark.slow
# continuous_usage_stats is vLLM's extension (usage on every chunk): not in the SDK's types.
USAGE_ON_EVERY_CHUNK: Any = {"include_usage": True, "continuous_usage_stats": True}
QUESTION: Any = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def token_id(c: Smollm2Cluster, text: str) -> int:
    (tid,) = c.http.post("/tokenize", {"prompt": text}).json()["tokens"]
    return int(tid)


def greedy_tokens(c: Smollm2Cluster, **fields: Any) -> list[str]:
    out = c.client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, logprobs=True, **fields
    )
    assert out.choices[0].logprobs is not None and out.choices[0].logprobs.content is not None
    return [t.token for t in out.choices[0].logprobs.content]


def test_logit_bias_forces_and_bans_tokens(smollm2: Smollm2Cluster) -> None:
    plain = greedy_tokens(smollm2)
    assert "Paris" in "".join(plain)
    # +100 on one token: it wins every step.
    banana = token_id(smollm2, " banana")
    forced = greedy_tokens(smollm2, logit_bias={str(banana): 100})
    assert forced == [" banana"] * 8
    # -100 on the greedy first token: it never comes.
    first = token_id(smollm2, plain[0])
    banned = greedy_tokens(smollm2, logit_bias={str(first): -100})
    assert plain[0] not in banned
    assert banned != plain


def test_echo_returns_the_prompt_with_its_logprobs(smollm2: Smollm2Cluster) -> None:
    prompt = "The quick brown fox jumps over"
    ids = smollm2.http.post("/tokenize", {"prompt": prompt}).json()["tokens"]
    out = smollm2.client.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=3, temperature=0
    )
    choice = out.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    lps = choice.logprobs
    assert lps is not None and lps.tokens and lps.token_logprobs and lps.top_logprobs
    assert len(lps.tokens) == len(ids) + 3
    assert "".join(lps.tokens[: len(ids)]) == prompt
    assert lps.token_logprobs[0] is None and lps.top_logprobs[0] is None
    assert all(lp is not None and lp <= 0 for lp in lps.token_logprobs[1:])
    assert lps.text_offset is not None and lps.text_offset[len(ids)] == len(prompt)
    # Position k's distribution is the one a completion of the first k tokens samples from.
    k = 3
    alone = smollm2.client.completions.create(
        model=MODEL, prompt=ids[:k], logprobs=1, max_tokens=1, temperature=0
    )
    assert alone.choices[0].logprobs is not None and alone.choices[0].logprobs.top_logprobs
    (top,) = alone.choices[0].logprobs.top_logprobs
    assert top is not None and lps.top_logprobs[k] is not None
    assert top.keys() == lps.top_logprobs[k].keys()
    assert list(top.values()) == pytest.approx(list(lps.top_logprobs[k].values()), abs=1e-4)
    assert out.usage is not None and out.usage.prompt_tokens == len(ids)
    # Streamed (without logprobs): the first chunk is the prompt.
    stream = smollm2.client.completions.create(
        model=MODEL, prompt=prompt, echo=True, max_tokens=3, temperature=0, stream=True
    )
    texts = [c.choices[0].text for c in stream]
    assert texts[0] == prompt
    assert "".join(texts) == choice.text


def test_usage_per_choice_and_on_every_chunk(smollm2: Smollm2Cluster) -> None:
    stream = smollm2.client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_completion_tokens=5,
        n=2,
        temperature=1.0,
        seed=3,
        stream=True,
        stream_options=USAGE_ON_EVERY_CHUNK,
    )
    chunks = list(stream)
    # Each token-bearing chunk carries its choice's usage so far; the role chunks none.
    running: dict[int, list[int]] = {0: [], 1: []}
    for c in chunks[:-1]:
        if c.usage is not None:
            running[c.choices[0].index].append(c.usage.completion_tokens)
    assert running == {0: [1, 2, 3, 4, 5], 1: [1, 2, 3, 4, 5]}
    final = chunks[-1]
    assert final.choices == [] and final.usage is not None
    # Each choice's tokens count; the prompt once (both choices share it).
    assert final.usage.completion_tokens == 10
    prompt = smollm2.http.post("/tokenize", {"messages": QUESTION}).json()["count"]
    assert final.usage.prompt_tokens == prompt
    assert final.usage.total_tokens == prompt + 10
    assert {c.usage.prompt_tokens for c in chunks[:-1] if c.usage is not None} == {prompt}
    finished = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finished) == [0, 1]


def test_the_serving_worker_is_named_in_a_header(smollm2: Smollm2Cluster) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    assert smollm2.http.post("/v1/completions", body).headers["x-radixmesh-worker"] == "worker-0"
    conn, resp = smollm2.http.open_stream("/v1/completions", {**body, "stream": True})
    try:
        assert resp.getheader("X-Radixmesh-Worker") == "worker-0"
        resp.read()
    finally:
        conn.close()


def test_models_retrieve(smollm2: Smollm2Cluster) -> None:
    model = smollm2.client.models.retrieve(MODEL)
    assert (model.id, model.object, model.owned_by) == (MODEL, "model", "radixmesh")
    with pytest.raises(openai.NotFoundError):
        smollm2.client.models.retrieve("gpt-9")
