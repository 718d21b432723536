from __future__ import annotations

import torch

from radixmesh.worker.constrained.grammar import Matcher
from radixmesh.worker.constrained.jump_forward import Jump, apply_jump, retokenize

# A toy tokenizer over bytes: ids 0..3 are single letters, 4 is "ab", 5 is "cd".
BYTES: list[bytes | None] = [b"a", b"b", b"c", b"d", b"ab", b"cd", None]


def encode(text: str) -> list[int]:
    ids, i = [], 0
    while i < len(text):
        two = text[i : i + 2].encode()
        if two in (b"ab", b"cd"):
            ids.append(BYTES.index(two))
            i += 2
        else:
            ids.append(BYTES.index(text[i].encode()))
            i += 1
    return ids


def test_forced_tokens_follow_an_unchanged_boundary() -> None:
    jump = retokenize(encode, BYTES, sampled=1, forced="cd")  # "b" + "cd"
    assert jump == Jump(tokens=[5], replaces_sampled=False)
    assert jump.num_forced == 1


def test_boundary_token_is_replaced_when_retokenization_merges() -> None:
    jump = retokenize(encode, BYTES, sampled=0, forced="bcd")  # "a"+"bcd" -> "ab","cd"
    assert jump == Jump(tokens=[4, 5], replaces_sampled=True)
    assert jump.num_forced == 1


def test_special_boundary_or_split_character_is_not_spliced() -> None:
    assert retokenize(encode, BYTES, sampled=6, forced="ab") is None
    split: list[bytes | None] = [b"\xc3"]  # first byte of "é"
    assert retokenize(lambda s: [0], split, sampled=0, forced="x") is None


class ListMatcher(Matcher):
    """Accepts tokens whose ids are in `ok`; records the accepted sequence."""

    def __init__(self, ok: set[int]) -> None:
        self.ok = ok
        self.seq: list[int] = []

    def accept_token(self, token: int) -> bool:
        if token not in self.ok:
            return False
        self.seq.append(token)
        return True

    def rollback(self, num_tokens: int) -> None:
        del self.seq[len(self.seq) - num_tokens :]

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        raise NotImplementedError

    def jump_forward_string(self) -> str:
        return ""

    def is_terminated(self) -> bool:
        return False


def test_apply_jump_replaces_the_sampled_token() -> None:
    m = ListMatcher({0, 4, 5})
    m.accept_token(0)
    assert apply_jump(m, 0, Jump(tokens=[4, 5], replaces_sampled=True))
    assert m.seq == [4, 5]


def test_apply_jump_restores_the_matcher_on_refusal() -> None:
    m = ListMatcher({0, 4})
    m.accept_token(0)
    assert not apply_jump(m, 0, Jump(tokens=[4, 5], replaces_sampled=True))
    assert m.seq == [0]
    assert not apply_jump(m, 0, Jump(tokens=[4, 5], replaces_sampled=False))
    assert m.seq == [0]
