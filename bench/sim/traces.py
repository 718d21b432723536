"""Request traces: grouped shared prefixes, multi-turn chats, no sharing, one hot prefix."""

from __future__ import annotations

import random
from collections.abc import Callable

from bench.sim.config import VOCAB, Request
from radixmesh.prefix import block_hashes


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def _poisson(rng: random.Random, rate: float, n: int) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def grouped_trace(
    workers: int,
    seed: int,
    block_size: int = 16,
    groups_per_worker: int = 4,
    requests_per_group: int = 24,
    prefix_len: int = 2048,
    question_len: int = 64,
    output_len: int = 16,
    rate_per_worker: float = 40.0,
    zipf: float = 0.6,
    top_share: float = 0.0,
) -> list[Request]:
    """Many groups of requests sharing a long system prompt; popularity Zipf-skewed (with
    `top_share`, the first group brings that share of the requests, the rest Zipf)."""
    rng = random.Random(seed)
    n_groups = groups_per_worker * workers
    prefixes = [random_tokens(rng, prefix_len) for _ in range(n_groups)]
    prefix_hashes = [block_hashes(p, block_size) for p in prefixes]
    weights = [1.0 / (g + 1) ** zipf for g in range(n_groups)]
    if top_share:
        rest = sum(weights[1:])
        weights = [top_share] + [(1 - top_share) * w / rest for w in weights[1:]]
    n = requests_per_group * n_groups
    arrivals = _poisson(rng, rate_per_worker * workers, n)
    out = []
    for rid, (arrival, g) in enumerate(
        zip(arrivals, rng.choices(range(n_groups), weights, k=n), strict=True)
    ):
        question, answer = random_tokens(rng, question_len), random_tokens(rng, output_len)
        # Continue the group's chain (the prefix is block-aligned) instead of rehashing it.
        root = prefix_hashes[g]
        ph = root + block_hashes(question, block_size, root[-1])
        full = root + block_hashes(question + answer, block_size, root[-1])
        out.append(Request(rid, arrival, prefix_len + question_len, output_len, ph, full))
    return out


def multiturn_trace(
    workers: int,
    seed: int,
    block_size: int = 16,
    chats_per_worker: int = 12,
    turns: int = 6,
    first_len: int = 512,
    message_len: int = 128,
    output_len: int = 64,
    start_rate_per_worker: float = 2.0,
    think_s: float = 2.0,
) -> list[Request]:
    """Chats: each turn's prompt is the previous prompt + its answer + a new message."""
    rng = random.Random(seed)
    n_chats = chats_per_worker * workers
    starts = _poisson(rng, start_rate_per_worker * workers, n_chats)
    out: list[Request] = []
    for start in starts:
        history: list[int] = []
        prev: int | None = None
        for turn in range(turns):
            history = history + random_tokens(rng, first_len if turn == 0 else message_len)
            answer = random_tokens(rng, output_len)
            full = block_hashes(history + answer, block_size)
            prompt = full[: len(history) // block_size]
            arrival = start if prev is None else rng.expovariate(1.0 / think_s)
            rid = len(out)
            out.append(Request(rid, arrival, len(history), output_len, prompt, full, prev))
            history, prev = history + answer, rid
    return out


def noshare_trace(
    workers: int,
    seed: int,
    block_size: int = 16,
    requests_per_worker: int = 48,
    prompt_len: int = 1024,
    output_len: int = 64,
    rate_per_worker: float = 10.0,
) -> list[Request]:
    """Unique prompts: nothing to share (the control)."""
    rng = random.Random(seed)
    n = requests_per_worker * workers
    out = []
    for rid, arrival in enumerate(_poisson(rng, rate_per_worker * workers, n)):
        ids = random_tokens(rng, prompt_len + output_len)
        full = block_hashes(ids, block_size)
        out.append(
            Request(rid, arrival, prompt_len, output_len, full[: prompt_len // block_size], full)
        )
    return out


def hot_trace(workers: int, seed: int, block_size: int = 16) -> list[Request]:
    """The grouped trace with one hot group: Zipf(1.5) over 2 groups per worker, so the
    most popular group alone brings about half of all requests."""
    return grouped_trace(workers, seed, block_size, groups_per_worker=2, zipf=1.5)


def hot_prefix_trace(
    workers: int,
    seed: int,
    block_size: int = 16,
    rate_per_worker: float = 15.0,
    prefix_len: int = 2048,
) -> list[Request]:
    """The grouped trace with one prefix bringing 60% of the requests, 128 output tokens
    each: decoding holds a worker's batch, so the hot prefix needs several workers (the
    hot-prefix replication's workload). With `prefix_len` 4,096 or more, cache_aware
    keeps the hot prefix's requests on its holder past a full batch (its queue costs
    64 tokens a request against the prefix's prefill elsewhere)."""
    return grouped_trace(
        workers,
        seed,
        block_size,
        requests_per_group=48,
        prefix_len=prefix_len,
        output_len=128,
        rate_per_worker=rate_per_worker,
        top_share=0.6,
    )


TRACES: dict[str, Callable[..., list[Request]]] = {
    "grouped": grouped_trace,
    "hot": hot_trace,
    "multiturn": multiturn_trace,
    "noshare": noshare_trace,
}
