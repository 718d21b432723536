"""`separate_reasoning`: a reasoning model's thinking, split from its answer.

Reasoning models write their thinking between markers before the answer. Families
differ in the markers and in whether the opening one is written at all (DeepSeek-R1's
template opens the block itself, so its output starts inside it). The names are SGLang's
reasoning-parser names for these families.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThinkMarkers:
    start: str
    end: str
    # The output begins inside the block even when it does not write `start`.
    starts_inside: bool = False


_THINK = ThinkMarkers("<think>", "</think>")
_THINK_FORCED = ThinkMarkers("<think>", "</think>", starts_inside=True)
MODEL_TYPES: dict[str, ThinkMarkers] = {
    "deepseek-r1": _THINK_FORCED,
    "step3": _THINK_FORCED,
    "step3p5": _THINK_FORCED,
    "gigachat35": _THINK_FORCED,
    "qwen3": _THINK,
    "qwen3-thinking": _THINK,
    "glm45": _THINK,
    "minimax": _THINK,
    "nanbeige": _THINK,
    "dots": _THINK,
    "interns1": _THINK,
    "kimi": ThinkMarkers("◁think▷", "◁/think▷"),
}


def check_model_type(model_type: object) -> None:
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"model_type: unknown reasoning model type {model_type!r}; "
            f"known: {', '.join(sorted(MODEL_TYPES))}"
        )


def split_reasoning(text: str, model_type: str) -> tuple[str, str]:
    """(reasoning, answer) of a model's output. Output that never closes the block is all
    reasoning (cut short); output with no block at all is all answer."""
    m = MODEL_TYPES[model_type]
    inside = m.starts_inside or m.start in text
    if not inside:
        return "", text
    body = text
    while body.startswith(m.start):
        body = body[len(m.start) :]
    reasoning, closed, answer = body.partition(m.end)
    if not closed:
        return reasoning, ""
    return reasoning, answer
