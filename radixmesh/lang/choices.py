"""How `select` picks among choices from their token logprobs (SGLang's three methods).

A backend scores each choice as the logprobs of the choice's tokens given the prompt
(`input_token_logprobs[i]`, entries `(logprob, token, text)`), and, for methods that ask
for it, the same tokens scored with no prompt (`unconditional_token_logprobs[i]`, whose
first entry has no logprob). The method turns those into a decision.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TokenLogprob = tuple[float | None, Any, Any]
TIE = 1e-4  # greedy_token_selection: logprobs this close are the same token's


@dataclass
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


class ChoicesSamplingMethod(ABC):
    """Maps per-choice token logprobs to one choice. Ties go to the earliest choice."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    @abstractmethod
    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[TokenLogprob]],
        output_token_logprobs: list[list[TokenLogprob]],
        unconditional_token_logprobs: list[list[TokenLogprob]] | None = None,
    ) -> ChoicesDecision: ...


def _first_best(scores: Sequence[float]) -> int:
    best = 0
    for i, value in enumerate(scores):
        if value > scores[best]:
            best = i
    return best


def _values(entries: Sequence[TokenLogprob]) -> list[float]:
    return [0.0 if e[0] is None else float(e[0]) for e in entries]


def normalized_logprob(entries: Sequence[TokenLogprob]) -> float:
    """Mean logprob over a choice's tokens (the "token length normalized" score)."""
    values = [float(e[0]) for e in entries if e[0] is not None]
    return sum(values) / len(values) if values else -math.inf


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The choice with the highest mean token logprob."""

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[TokenLogprob]],
        output_token_logprobs: list[list[TokenLogprob]],
        unconditional_token_logprobs: list[list[TokenLogprob]] | None = None,
    ) -> ChoicesDecision:
        best = _first_best(normalized_prompt_logprobs)
        return ChoicesDecision(
            choices[best],
            {
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
            },
        )


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Token by token, keep the choices whose logprob at that position is the highest.

    A shorter choice is padded with its own mean logprob so it can still compete with
    longer ones that share its beginning. Logprobs within `TIE` count as equal: choices
    sharing a first token are scored in different requests, whose batch shapes change
    the float rounding in the last digits."""

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[TokenLogprob]],
        output_token_logprobs: list[list[TokenLogprob]],
        unconditional_token_logprobs: list[list[TokenLogprob]] | None = None,
    ) -> ChoicesDecision:
        rows = [_values(entries) for entries in input_token_logprobs]
        width = max(len(r) for r in rows)
        matrix = [r + [sum(r) / len(r) if r else -math.inf] * (width - len(r)) for r in rows]
        alive = list(range(len(choices)))
        for col in range(width):
            top = max(matrix[i][col] for i in alive)
            alive = [i for i in alive if top - matrix[i][col] <= TIE]
            if len(alive) == 1:
                break
        return ChoicesDecision(
            choices[alive[0]],
            {
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
                "greedy_logprob_matrix": matrix,
            },
        )


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Highest mean of (logprob given the prompt - logprob with no prompt) per token.

    The first unconditional token has no logprob (nothing precedes it); it counts as 0."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[list[TokenLogprob]],
        output_token_logprobs: list[list[TokenLogprob]],
        unconditional_token_logprobs: list[list[TokenLogprob]] | None = None,
    ) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        scores: list[float] = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs, strict=True):
            if len(cond) != len(uncond):
                raise ValueError("conditional and unconditional logprobs differ in length")
            diffs = [c - u for c, u in zip(_values(cond), _values(uncond), strict=True)]
            scores.append(sum(diffs) / len(diffs) if diffs else -math.inf)
        best = _first_best(scores)
        return ChoicesDecision(
            choices[best],
            {
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
                "unconditional_token_logprobs": unconditional_token_logprobs,
                "normalized_unconditional_prompt_logprobs": scores,
            },
        )


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
