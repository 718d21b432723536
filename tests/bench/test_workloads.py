"""The serving benchmark's workloads: exact lengths, seeds, and the ideal hits."""

from __future__ import annotations

import pytest

from bench.serving.workloads import (
    PromptMaker,
    extend_history,
    multi_turn_workload,
    random_workload,
    shared_prefix_workload,
    warmup_workload,
)
from radixmesh.tokenizer import ByteTokenizer, TokenizerLike
from radixmesh.worker.model.loader import load_tokenizer


@pytest.fixture(scope="module")
def smollm2() -> TokenizerLike:
    return load_tokenizer("smollm2")


def test_a_hot_share_gives_group_zero_that_share_of_the_requests() -> None:
    w = shared_prefix_workload(
        num_groups=5,
        requests_per_group=4,
        prefix_len=20,
        question_len=3,
        output_len=2,
        mode="ids",
        seed=0,
        hot_share=0.6,
    )
    per_group = [sum(1 for s in w.sessions if s.group == g) for g in range(5)]
    assert per_group == [12, 2, 2, 2, 2]  # 60% of 20; the other 8 spread evenly
    assert w.params["hot_share"] == 0.6


def test_random_prompts_have_the_lengths_asked_for() -> None:
    w = random_workload(num_requests=20, input_len=(5, 9), output_len=(3, 3), mode="ids", seed=1)
    assert w.num_requests == 20
    lengths = [len(s.turns[0].message) for s in w.sessions]
    assert min(lengths) >= 5 and max(lengths) <= 9 and len(set(lengths)) > 1
    assert {s.turns[0].max_tokens for s in w.sessions} == {3}
    assert all(s.turns[0].ideal_cached == 0 for s in w.sessions)
    again = random_workload(
        num_requests=20, input_len=(5, 9), output_len=(3, 3), mode="ids", seed=1
    )
    other = random_workload(
        num_requests=20, input_len=(5, 9), output_len=(3, 3), mode="ids", seed=2
    )
    assert again == w and other != w


def test_ids_stay_inside_the_vocabulary() -> None:
    tok = ByteTokenizer(512)
    w = random_workload(
        num_requests=8, input_len=(64, 64), output_len=(1, 1), mode="ids", tokenizer=tok
    )
    ids = [s.turns[0].message for s in w.sessions]
    assert all(isinstance(m, list) and all(0 <= t < 512 for t in m) for m in ids)


def test_shared_prefix_groups_and_ideal_hits() -> None:
    w = shared_prefix_workload(
        num_groups=3,
        requests_per_group=4,
        prefix_len=50,
        question_len=7,
        output_len=2,
        mode="ids",
        seed=0,
    )
    assert w.num_requests == 12
    by_group: dict[int, list[list[int]]] = {}
    for s in w.sessions:
        assert isinstance(s.turns[0].message, list)
        by_group.setdefault(s.group, []).append(s.turns[0].message)
    assert sorted(len(v) for v in by_group.values()) == [4, 4, 4]
    for prompts in by_group.values():
        assert all(p[:50] == prompts[0][:50] and len(p) == 57 for p in prompts)
    # Only each group's first request misses: 3 x 0 + 9 x 50.
    assert [s.turns[0].ideal_cached for s in w.sessions].count(0) == 3
    assert sum(s.turns[0].ideal_cached for s in w.sessions) == 9 * 50


def test_multi_turn_ideal_is_the_history(smollm2: TokenizerLike) -> None:
    w = multi_turn_workload(
        num_conversations=2,
        turns=3,
        system_len=20,
        message_len=5,
        output_len=4,
        think_time=0.0,
        mode="ids",
        seed=0,
    )
    turns = w.sessions[0].turns
    assert [t.ideal_cached for t in turns] == [0, 25 + 4, 25 + 4 + 5 + 4]
    history = extend_history([1, 2], [3], [4, 5])
    assert history == [1, 2, 3, 4, 5]
    text = multi_turn_workload(
        num_conversations=1,
        turns=2,
        system_len=30,
        message_len=6,
        output_len=4,
        think_time=0.0,
        mode="text",
        tokenizer=smollm2,
    )
    assert isinstance(text.sessions[0].turns[0].message, str)


def test_text_prompts_have_about_the_token_count(smollm2: TokenizerLike) -> None:
    import random

    maker = PromptMaker("text", random.Random(0), smollm2)
    for n in (16, 100, 400):
        prompt = maker.make(n)
        assert isinstance(prompt, str)
        assert abs(len(smollm2.encode(prompt)) - n) <= 2
    with pytest.raises(ValueError, match="mode: text prompts need the model's tokenizer"):
        PromptMaker("text", random.Random(0), None)


def test_warmup_has_the_workloads_prompt_lengths_and_none_of_its_tokens() -> None:
    w = shared_prefix_workload(
        num_groups=2,
        requests_per_group=3,
        prefix_len=40,
        question_len=5,
        output_len=9,
        mode="ids",
        seed=3,
    )
    warm = warmup_workload(w, 4, seed=4, tokenizer=None)
    assert [len(s.turns[0].message) for s in warm.sessions] == [45] * 4
    assert {s.turns[0].max_tokens for s in warm.sessions} == {8}
    prefixes = {tuple(s.turns[0].message[:40]) for s in w.sessions}
    assert not prefixes & {tuple(s.turns[0].message[:40]) for s in warm.sessions}
