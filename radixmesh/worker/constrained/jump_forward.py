"""Compressed-FSM jump-forward: turn a forced string into tokens to append.

The forced text is tokenized together with the boundary: the last sampled token's bytes
followed by the forced string. A tokenizer may merge across that boundary (`"` sampled,
`name": "` forced -> `"name`, `":`, ` "`), and appending the forced tokens alone would
leave a tokenization the model never saw in training. So the boundary token is replaced
when the retokenization starts differently. It is the only token ever replaced: it has no
KV yet (it is computed in the next step together with the forced tokens), so rolling it
back costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radixmesh.worker.constrained.grammar import Matcher


@dataclass(frozen=True)
class Jump:
    """Replace the sampled token by `tokens` (when `replaces_sampled`), or append them."""

    tokens: list[int]
    replaces_sampled: bool

    @property
    def num_forced(self) -> int:
        """Tokens added beyond the sampled one: the decode steps this jump saves."""
        return len(self.tokens) - 1 if self.replaces_sampled else len(self.tokens)


def retokenize(
    encode: Callable[[str], list[int]],
    token_bytes: Sequence[bytes | None],
    sampled: int,
    forced: str,
) -> Jump | None:
    """Tokens for `forced` after the boundary token `sampled`, or None when the
    concatenation is not text that round-trips through the tokenizer."""
    head = token_bytes[sampled]
    if head is None:
        return None
    raw = head + forced.encode()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # the boundary token ends inside a character
        return None
    ids = encode(text)
    if b"".join(token_bytes[t] or b"\xff" for t in ids) != raw:
        return None  # e.g. a tokenizer that prepends a space: not safe to splice
    if ids and ids[0] == sampled:
        return Jump(tokens=ids[1:], replaces_sampled=False)
    return Jump(tokens=ids, replaces_sampled=True)


def apply_jump(matcher: Matcher, sampled: int, jump: Jump) -> bool:
    """Make `matcher` (which has just accepted `sampled`) accept the jump's tokens
    instead. On any refusal it is restored (to just after `sampled`) and False returned."""
    if jump.replaces_sampled:
        matcher.rollback(1)
    accepted = 0
    for t in jump.tokens:
        if not matcher.accept_token(t):
            break
        accepted += 1
    if accepted == len(jump.tokens):
        return True
    matcher.rollback(accepted)
    if jump.replaces_sampled:
        matcher.accept_token(sampled)
    return False
