"""Regex, choices and EBNF constraints on the bundled model (session engine)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from radixmesh.worker.engine import Engine
from tests.worker.conftest import assert_engine_idle_and_clean

pytestmark = pytest.mark.slow

REGEXES = [
    r"[0-9]{3}-[0-9]{4}",
    r"(yes|no), because [a-z ]{5,20}\.",
    r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}",
    r"\d{4}-\d{2}-\d{2}",
    r"(0|[1-9][0-9]?)\.[0-9]{2} EUR",
    r"[a-z]{3,10}@[a-z]{3,10}\.(com|org)",
    r"The answer is (4|5|6)\.",
]


def test_regex_outputs_fullmatch(engine: Engine) -> None:
    prompts = [f"Example {i}: " for i in range(len(REGEXES))]
    params = [{"temperature": 0, "max_new_tokens": 40, "regex": r} for r in REGEXES]
    outs = engine.generate(prompts, params)
    assert isinstance(outs, list)
    for regex, out in zip(REGEXES, outs, strict=True):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (regex, out)
        assert re.fullmatch(regex, out["text"]), (regex, out["text"])
    assert_engine_idle_and_clean(engine)


def test_choices_pick_one_of_them(engine: Engine) -> None:
    choices = ["Paris", "London", "Berlin", "Rome"]
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 8, "choices": choices})
    assert isinstance(out, dict)
    assert out["text"] in choices
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    sampled = engine.generate(
        [prompt] * 4, {"temperature": 1.0, "max_new_tokens": 8, "choices": choices, "seed": 3}
    )
    assert isinstance(sampled, list)
    assert all(o["text"] in choices for o in sampled)


def test_ebnf_grammar(engine: Engine) -> None:
    grammar = (
        'root ::= "The " animal " says " sound "."\nanimal ::= "cat" | "dog"\nsound ::= [a-z]{2,6}'
    )
    out = engine.generate("A farm fact:", {"temperature": 0, "max_new_tokens": 24, "ebnf": grammar})
    assert isinstance(out, dict)
    assert re.fullmatch(r"The (cat|dog) says [a-z]{2,6}\.", out["text"]), out["text"]


def test_unconstrained_requests_share_the_batch(engine: Engine) -> None:
    params: list[dict[str, Any]] = [
        {"temperature": 0, "max_new_tokens": 6},
        {"temperature": 0, "max_new_tokens": 6, "regex": "[0-9]{6}"},
    ]
    outs = engine.generate(["The capital of France is", "Digits:"], params)
    assert isinstance(outs, list)
    alone = engine.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 6})
    assert isinstance(alone, dict)
    assert outs[0]["text"] == alone["text"]
    assert "forced_tokens" not in outs[0]["meta_info"]
    assert re.fullmatch("[0-9]{6}", outs[1]["text"])


def test_logprobs_cover_forced_tokens(engine: Engine) -> None:
    """Forced tokens carry logprob 0 (probability 1 under the constraint)."""
    out = engine.generate(
        "Code:",
        {
            "temperature": 0,
            "max_new_tokens": 20,
            "regex": r"ORDER-NUMBER-[0-9]{2}",
            "return_logprob": True,
        },
    )
    assert isinstance(out, dict)
    meta = out["meta_info"]
    lps = meta["output_token_logprobs"]
    assert len(lps) == meta["completion_tokens"] == len(out["output_ids"])
    assert [t for _, t, _ in lps] == out["output_ids"]
    assert meta["forced_tokens"] > 0
    assert sum(1 for lp, _, _ in lps if lp == 0.0) >= meta["forced_tokens"]
