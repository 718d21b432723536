"""Seeded synthetic workloads for the serving benchmark.

A workload is a list of `Session`s. A session is one or more user turns sent one after
another: each turn's prompt is the conversation so far (earlier prompts and replies) plus
the new user message, so a multi-turn session resends its growing history, as chat
clients do. Single-request workloads are sessions of one turn.

Prompts are token ids (`mode="ids"`: what a `dummy:` model with a byte tokenizer needs, and
exact lengths) or text (`mode="text"`: for real models, sized with the model's tokenizer).

Each turn states its `ideal_cached` tokens: what a cache that kept everything would hit
(every repeat of a shared prefix, every resent history), the bound a router's placement is
measured against.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from radixmesh.tokenizer import TokenizerLike

Mode = Literal["ids", "text"]
Prompt = str | list[int]

# Words for text prompts: common English, so a real tokenizer spends about a token each.
_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his her they this be are "
    "have not but had which one were all their there been when who will more no if "
    "out so said what up its about into than them can only other new some could time "
    "these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never "
    "day same another know while last might us great old year off come since against "
    "go came right used take three city river light house music water story paper "
    "garden winter market number"
)
WORDS = _WORD_TEXT.split()


@dataclass(frozen=True)
class Turn:
    """One user message of a session, with what the reply may be."""

    message: Prompt  # the new user tokens (ids) or text appended to the history
    max_tokens: int  # output tokens asked for (ignore_eos: exactly this many)
    ideal_cached: int  # prompt tokens an ideal cache would hold (the history and prefixes)


@dataclass(frozen=True)
class Session:
    turns: tuple[Turn, ...]
    group: int = -1  # the shared-prefix group, the conversation, or -1
    think_time: float = 0.0  # seconds between a reply and the next turn


@dataclass(frozen=True)
class Workload:
    name: str
    mode: Mode
    sessions: tuple[Session, ...]
    params: dict[str, float | int | str] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


class PromptMaker:
    """Random prompts of exact token lengths, as ids or as text."""

    def __init__(self, mode: Mode, rng: random.Random, tokenizer: TokenizerLike | None) -> None:
        if mode == "text" and tokenizer is None:
            raise ValueError("mode: text prompts need the model's tokenizer")
        self.mode = mode
        self.rng = rng
        self.tokenizer = tokenizer
        vocab = tokenizer.vocab_size if tokenizer is not None else 32000
        # Ids mode draws printable bytes' ids and beyond: any id the model embeds works,
        # but ids that decode to text keep byte-tokenizer prompts readable in logs.
        self.id_range = (32, min(vocab, 50000) - 1)

    def make(self, num_tokens: int) -> Prompt:
        if self.mode == "ids":
            lo, hi = self.id_range
            return [self.rng.randint(lo, hi) for _ in range(num_tokens)]
        assert self.tokenizer is not None
        # About a token a word: draw generously, cut at the token count, decode back.
        words = " ".join(self.rng.choice(WORDS) for _ in range(num_tokens + 8))
        ids = self.tokenizer.encode(" " + words)[:num_tokens]
        return self.tokenizer.decode(ids)

    def length(self, prompt: Prompt) -> int:
        if isinstance(prompt, list):
            return len(prompt)
        assert self.tokenizer is not None
        return len(self.tokenizer.encode(prompt))


def _uniform(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi) if hi > lo else lo


def random_workload(
    *,
    num_requests: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    mode: Mode,
    seed: int = 0,
    tokenizer: TokenizerLike | None = None,
) -> Workload:
    """Independent prompts and outputs of lengths drawn uniformly from the ranges: no two
    prompts share more than chance, so no cache can help (the control)."""
    rng = random.Random(seed)
    maker = PromptMaker(mode, rng, tokenizer)
    sessions = tuple(
        Session((Turn(maker.make(_uniform(rng, *input_len)), _uniform(rng, *output_len), 0),))
        for _ in range(num_requests)
    )
    params = {"input_len": f"{input_len[0]}-{input_len[1]}", "output_len": f"{output_len}"}
    return Workload("random", mode, sessions, {**params, "seed": seed})


def shared_prefix_workload(
    *,
    num_groups: int,
    requests_per_group: int,
    prefix_len: int,
    question_len: int,
    output_len: int,
    mode: Mode,
    seed: int = 0,
    tokenizer: TokenizerLike | None = None,
    hot_share: float = 0.0,
) -> Workload:
    """`num_groups` long system prompts, each followed by `requests_per_group` questions;
    the requests of all groups are shuffled together. Every request after its group's
    first could hit the group's prefix. With `hot_share`, group 0 brings that share of the
    `num_groups` x `requests_per_group` requests and the others share the rest evenly (a
    hot prefix)."""
    rng = random.Random(seed)
    maker = PromptMaker(mode, rng, tokenizer)
    prefixes = [maker.make(prefix_len) for _ in range(num_groups)]
    prefix_tokens = [maker.length(p) for p in prefixes]
    order = [g for g in range(num_groups) for _ in range(requests_per_group)]
    if hot_share and num_groups > 1:
        n = len(order)
        hot = round(hot_share * n)
        order = [0] * hot + [1 + i % (num_groups - 1) for i in range(n - hot)]
    rng.shuffle(order)
    seen: set[int] = set()
    sessions = []
    for g in order:
        question = maker.make(question_len)
        prompt = _join(prefixes[g], question)
        ideal = prefix_tokens[g] if g in seen else 0
        seen.add(g)
        sessions.append(Session((Turn(prompt, output_len, ideal),), group=g))
    params: dict[str, float | int | str] = {
        "num_groups": num_groups,
        "requests_per_group": requests_per_group,
        "prefix_len": prefix_len,
        "question_len": question_len,
        "output_len": output_len,
        "seed": seed,
    }
    if hot_share:
        params["hot_share"] = hot_share
    return Workload("shared-prefix", mode, tuple(sessions), params)


def multi_turn_workload(
    *,
    num_conversations: int,
    turns: int,
    system_len: int,
    message_len: int,
    output_len: int,
    think_time: float,
    mode: Mode,
    seed: int = 0,
    tokenizer: TokenizerLike | None = None,
) -> Workload:
    """Conversations of `turns` user messages after a system prompt of their own; each
    turn resends the whole history (think time between turns). Turn k's ideal hit is the
    history before its new message: the earlier prompts and replies."""
    rng = random.Random(seed)
    maker = PromptMaker(mode, rng, tokenizer)
    sessions = []
    for c in range(num_conversations):
        history = maker.make(system_len)
        first = _join(history, maker.make(message_len))
        known = 0  # tokens of history before the new message
        items = [Turn(first, output_len, 0)]
        known = maker.length(first) + output_len
        for _ in range(turns - 1):
            message = maker.make(message_len)
            items.append(Turn(message, output_len, known))
            known += maker.length(message) + output_len
        sessions.append(Session(tuple(items), group=c, think_time=think_time))
    params: dict[str, float | int | str] = {
        "num_conversations": num_conversations,
        "turns": turns,
        "system_len": system_len,
        "message_len": message_len,
        "output_len": output_len,
        "think_time": think_time,
        "seed": seed,
    }
    return Workload("multi-turn", mode, tuple(sessions), params)


def warmup_workload(
    workload: Workload, num_requests: int, *, seed: int, tokenizer: TokenizerLike | None
) -> Workload:
    """Requests shaped like `workload`'s first turns (the same prompt lengths, 8 output
    tokens) but of fresh random tokens, so the kernels a run's shapes need are compiled
    before it while its prefixes stay uncached."""
    rng = random.Random(seed)
    maker = PromptMaker(workload.mode, rng, tokenizer)
    lengths = [maker.length(s.turns[0].message) for s in workload.sessions[:num_requests]]
    sessions = tuple(Session((Turn(maker.make(n), 8, 0),)) for n in lengths)
    return Workload(f"{workload.name}-warmup", workload.mode, sessions)


def _join(a: Prompt, b: Prompt) -> Prompt:
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    assert isinstance(a, str) and isinstance(b, str)
    return a + "\n" + b


def extend_history(history: Prompt, reply: Prompt, message: Prompt) -> Prompt:
    """The next turn's prompt: the last prompt, its reply, the new message."""
    if isinstance(history, list):
        assert isinstance(reply, list) and isinstance(message, list)
        return history + reply + message
    assert isinstance(reply, str) and isinstance(message, str)
    return history + reply + "\n" + message


Builder = Callable[..., Workload]
WORKLOADS: dict[str, Builder] = {
    "random": random_workload,
    "shared-prefix": shared_prefix_workload,
    "multi-turn": multi_turn_workload,
}


def describe(workloads: Sequence[Workload]) -> str:
    return ", ".join(f"{w.name} ({w.num_requests} requests)" for w in workloads)
