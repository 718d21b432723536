"""The three choices methods on hand-made logprobs (no model)."""

from __future__ import annotations

import pytest

import radixmesh as sgl
from radixmesh.lang.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    TokenLogprob,
    normalized_logprob,
)


def _entries(*lps: float | None) -> list[tuple[float | None, int, str]]:
    return [(lp, i, f"t{i}") for i, lp in enumerate(lps)]


CHOICES = ["a", "ab", "c"]
COND = [_entries(-1.0), _entries(-1.0, -0.5), _entries(-0.9, -3.0)]


def _call(
    method: ChoicesSamplingMethod, uncond: list[list[TokenLogprob]] | None = None
) -> ChoicesDecision:
    return method(
        choices=CHOICES,
        normalized_prompt_logprobs=[normalized_logprob(c) for c in COND],
        input_token_logprobs=COND,
        output_token_logprobs=[[], [], []],
        unconditional_token_logprobs=uncond,
    )


def test_token_length_normalized_picks_the_best_mean() -> None:
    d = _call(sgl.token_length_normalized)
    assert d.meta_info["normalized_prompt_logprobs"] == [-1.0, -0.75, -1.95]
    assert d.decision == "ab"


def test_greedy_token_selection_goes_token_by_token() -> None:
    d = _call(sgl.greedy_token_selection)
    # "c" has the best first token (-0.9) although its mean is the worst.
    assert d.meta_info["greedy_logprob_matrix"] == [[-1.0, -1.0], [-1.0, -0.5], [-0.9, -3.0]]
    assert d.decision == "c"


def test_greedy_token_selection_breaks_ties_on_later_tokens() -> None:
    cond = [_entries(-1.0), _entries(-1.00001, -0.5)]  # same first token, rounding apart
    d = sgl.greedy_token_selection(
        choices=["a", "ab"],
        normalized_prompt_logprobs=[normalized_logprob(c) for c in cond],
        input_token_logprobs=cond,
        output_token_logprobs=[[], []],
    )
    assert d.decision == "ab"  # padded "a" scores -1.0 at position 2, "ab" -0.5


def test_unconditional_likelihood_normalized_subtracts_the_prior() -> None:
    uncond = [_entries(None), _entries(None, -0.1), _entries(None, -4.0)]
    d = _call(sgl.unconditional_likelihood_normalized, uncond)
    # means of (cond - uncond), the first unconditional entry counting as 0
    assert d.meta_info["normalized_unconditional_prompt_logprobs"] == pytest.approx(
        [-1.0, (-1.0 + -0.4) / 2, (-0.9 + 1.0) / 2]
    )
    assert d.decision == "c"
    assert sgl.unconditional_likelihood_normalized.requires_unconditional_logprobs
    with pytest.raises(ValueError, match="needs unconditional logprobs"):
        _call(sgl.unconditional_likelihood_normalized)


def test_ties_go_to_the_first_choice() -> None:
    cond = [_entries(-1.0), _entries(-1.0)]
    d = sgl.token_length_normalized(
        choices=["x", "y"],
        normalized_prompt_logprobs=[-1.0, -1.0],
        input_token_logprobs=cond,
        output_token_logprobs=[[], []],
    )
    assert d.decision == "x"
