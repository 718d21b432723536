"""`<think>...</think>` split off a reply as it streams."""

from __future__ import annotations

import pytest

from radixmesh.router.http.openai.reasoning import ReasoningSplitter


def split(text: str, piece: int, prompt_tail: str = "") -> tuple[str, str]:
    s = ReasoningSplitter.after_prompt(prompt_tail)
    reasoning = content = ""
    for i in range(0, len(text), piece):
        r, c = s.feed(text[i : i + piece])
        reasoning, content = reasoning + r, content + c
    r, c = s.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize("piece", [1, 2, 5, 1000])
@pytest.mark.parametrize(
    ("text", "tail", "reasoning", "content"),
    [
        ("<think>\nTwo and two.\n</think>\n\nFour.", "", "\nTwo and two.\n", "Four."),
        ("  <think>a</think>b", "", "a", "b"),
        # The template opened the block: the reply starts in it.
        ("Hmm, 4.\n</think>\n\nFour.", "<|im_start|>assistant\n<think>\n", "Hmm, 4.\n", "Four."),
        (
            "No thinking, <think> later is content.",
            "",
            "",
            "No thinking, <think> later is content.",
        ),
        ("<think>cut short by max_tokens", "", "cut short by max_tokens", ""),
        ("<thin", "", "", "<thin"),  # ended inside a would-be tag: content
        ("", "", "", ""),
    ],
)
def test_split(text: str, tail: str, reasoning: str, content: str, piece: int) -> None:
    assert split(text, piece, tail) == (reasoning, content)


def test_text_waits_only_while_it_may_open_the_block() -> None:
    s = ReasoningSplitter()
    assert s.feed("<th") == ("", "")
    assert s.feed("ink>x</th") == ("x", "")
    assert s.feed("ink>y") == ("", "y")
    assert ReasoningSplitter().feed("Plain") == ("", "Plain")
