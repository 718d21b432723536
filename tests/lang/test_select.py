"""select on the engine: the three choices methods against hand-computed logprobs."""

from __future__ import annotations

import pytest

import radixmesh as sgl
from radixmesh.worker.engine import Engine
from tests.lang.conftest import assert_idle

pytestmark = pytest.mark.slow

PROMPT = (
    "Q: What color is grass? A: green\n"
    "Q: What color is snow? A: white\n"
    "Q: What color is the clear daytime sky? A:"
)
CHOICES = [" blue", " blue-grey", " red", " yellow"]


@sgl.function
def few_shot(s, method):
    s += PROMPT
    s += sgl.select("color", choices=CHOICES, choices_method=method)


def _by_hand(engine: Engine, prompt: str, choices: list[str]) -> tuple[list, list]:
    """Per choice: the logprobs of its tokens after the prompt, and of them alone.

    Each full text is scored from position 1 in one request (a different request shape
    than the backend's), and the choice's part is cut out here."""
    tok = engine.tokenizer
    ctx = tok.encode(prompt)
    cond, uncond = [], []
    for c in choices:
        full = tok.encode(prompt + c)
        k = next(i for i, (a, b) in enumerate(zip([*ctx, -1], full, strict=False)) if a != b)
        out = engine.generate(
            input_ids=full,
            sampling_params={"max_new_tokens": 1, "return_logprob": True, "logprob_start_len": 1},
        )
        assert isinstance(out, dict)
        lps = out["meta_info"]["input_token_logprobs"]  # positions 1..len-1
        cond.append([lp for lp, _, _ in lps[k - 1 :]])
        alone = engine.generate(
            input_ids=full[k:],
            sampling_params={"max_new_tokens": 1, "return_logprob": True, "logprob_start_len": 0},
        )
        assert isinstance(alone, dict)
        entries = alone["meta_info"]["input_token_logprobs"] or [(None, full[k], None)]
        uncond.append([lp or 0.0 for lp, _, _ in entries])  # one token alone: no logprob
    return cond, uncond


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_token_length_normalized(backend: Engine) -> None:
    cond, _ = _by_hand(backend, PROMPT, CHOICES)
    means = [_mean(c) for c in cond]
    s = few_shot.run(method=sgl.token_length_normalized)
    meta = s.get_meta_info("color")
    assert meta["normalized_prompt_logprobs"] == pytest.approx(means, abs=1e-4)
    assert s["color"] == CHOICES[means.index(max(means))]
    assert s.text() == PROMPT + s["color"]
    assert [len(x) for x in meta["input_token_logprobs"]] == [len(c) for c in cond]
    assert_idle(backend)


def test_greedy_token_selection(backend: Engine) -> None:
    cond, _ = _by_hand(backend, PROMPT, CHOICES)
    width = max(len(c) for c in cond)
    matrix = [c + [_mean(c)] * (width - len(c)) for c in cond]
    alive = list(range(len(CHOICES)))
    for j in range(width):
        top = max(matrix[i][j] for i in alive)
        alive = [i for i in alive if top - matrix[i][j] <= 1e-4]
        if len(alive) == 1:
            break
    s = few_shot.run(method=sgl.greedy_token_selection)
    meta = s.get_meta_info("color")
    for got, want in zip(meta["greedy_logprob_matrix"], matrix, strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    assert s["color"] == CHOICES[alive[0]]
    # " blue" and " blue-grey" share their first token: the same first column entry.
    assert meta["greedy_logprob_matrix"][0][0] == pytest.approx(
        meta["greedy_logprob_matrix"][1][0], abs=1e-5
    )


def test_unconditional_likelihood_normalized(backend: Engine) -> None:
    cond, uncond = _by_hand(backend, PROMPT, CHOICES)
    scores = [
        _mean([c - u for c, u in zip(cs, us, strict=True)])
        for cs, us in zip(cond, uncond, strict=True)
    ]
    s = few_shot.run(method=sgl.unconditional_likelihood_normalized)
    meta = s.get_meta_info("color")
    assert meta["normalized_unconditional_prompt_logprobs"] == pytest.approx(scores, abs=1e-4)
    assert s["color"] == CHOICES[scores.index(max(scores))]
    assert meta["unconditional_token_logprobs"][0][0][0] is None  # nothing before it
    assert_idle(backend)


def test_choice_that_merges_with_the_prompts_last_token(backend: Engine) -> None:
    """'A: ' + 'blue' tokenizes as 'A:' ' blue': the score covers ' blue', not ' '."""
    tok = backend.tokenizer
    prompt = "The sky is blue. Q: What color is the sky? A: "

    @sgl.function
    def prog(s):
        s += prompt + sgl.select("c", choices=["blue", "green"])

    s = prog.run()
    meta = s.get_meta_info("c")
    scored_ids = [tid for _, tid, _ in meta["input_token_logprobs"][0]]
    full = tok.encode(prompt + "blue")
    assert scored_ids == full[len(full) - len(scored_ids) :]
    assert tok.decode(scored_ids) == " blue"
    assert s["c"] == "blue"
    assert s.text() == prompt + "blue"


def test_gen_with_choices_is_select(backend: Engine) -> None:
    @sgl.function
    def prog(s):
        s += PROMPT + sgl.gen("color", choices=CHOICES)

    means = [_mean(c) for c in _by_hand(backend, PROMPT, CHOICES)[0]]
    assert prog.run()["color"] == CHOICES[means.index(max(means))]
