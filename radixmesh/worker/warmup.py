"""Warm-up: dummy requests through the worker's scheduler and model runner before it is ready.

Triton compiles a kernel at its first launch with each new specialization: each set of
constexpr values (tiles chosen from row counts: the FP8 small-batch GEMM's kernel per
power-of-two row count, the extend kernel's short and long tiles) and each new pattern of
its integer arguments (Triton specializes an int on being 1 and on being a multiple of
16). A compile takes ~0.1-1 s, and a library kernel loads its module at first use. On an
H200 the first FP8 prefill after start stalled ~1.9 s, a tenth of a 21-second benchmark
(docs/performance.md, "Cold start"). The decode graphs' capture ran the decode path at
every ladder size already; with `ModelConfig.warmup` on, the worker runs the rest here
through the path requests take (scheduler -> model runner -> attention backend ->
sampler), before it returns. The rounds (`warmup_plan`), each stepped until it finishes:

1. alone, prompts of `SHORT_PROMPTS` tokens: a step of one token, steps in each of the
   FP8 small-batch GEMM's row-count kernels (up to 16 rows) and past it, multiples of
   16 and not;
2. alone, a prompt of a whole step (the token budget: the extend kernel's long tiles on a
   GPU) and one of `MEDIUM_PROMPT` tokens (short tiles, not a multiple of 16, and more
   rows than a default decode graph has, so it runs as an extend rather than as graphed
   decode rows);
3. the first half of round 2's long prompt, cached in the radix tree by then, followed by
   new tokens: a prefill over a cached prefix;
4. requests decoding with every kind of sampling (greedy; temperature with top-k, top-p
   and min-p; penalties; logprobs with a seed), joined after two steps by a
   `MEDIUM_PROMPT`-token prompt: steps that mix decode rows with a prompt chunk;
5. as many requests as the worker runs at once (`many_rows`: the running cap), one-token
   prompts decoding a few tokens, so that a batch's widest steps run before it does: on
   an H200 with FP8 KV the cap is 1,024 and the largest decode graph 512, and a full
   batch's decode steps run eagerly past it, through kernels and row counts that no
   graph's capture and none of the rounds above launched. The steps: the prompts (one
   row each), decode steps at the cap's row count, then, once some requests have ended,
   at a row count of the other pattern (a multiple of 16 or not, `_fewer_rows`), then
   those rows beside a `MANY_ROWS_PROMPT`-token prompt chunk (a mixed step with many
   decode rows, as when a batch admits prompts beside its running requests).

Lengths are capped by the token budget, the context and a quarter of the pool (round 5's
row count too, at its requests' slots each), so a small worker runs the same rounds,
smaller. On a CPU round 5 runs the CPU's running cap (64 by default: a few milliseconds a
step on a tiny model); there are no graphs there and nothing compiles. Afterwards the
radix cache is reset and every KV slot and req->token table row checked free, and the
random number generators are as they were (unseeded sampling stays reproducible from
ModelConfig.seed); the worker then builds its scheduler again, so the one that serves
starts with its counters at zero. A Triton compile log open in the process
(worker/triton_compiles.py) labels the compiles in here "warmup", each with its step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.batch import Batch, ForwardOutput
from radixmesh.worker.request import FinishReason, Request
from radixmesh.worker.scheduler import ModelRunnerLike, Scheduler
from radixmesh.worker.triton_compiles import compile_phase, note_step

# Round 1's prompt lengths: one token; 2, 3, 5 and 9 rows (the small-batch FP8 GEMM's
# kernels for 2, 4, 8 and 16 rows, none a multiple of 16); 16 (its largest, a multiple);
# 17 and 48 (the FP8 GEMM past it, not a multiple of 16 and one).
SHORT_PROMPTS = (1, 2, 3, 5, 9, 16, 17, 48)
# More rows than the largest default decode graph (512) and more keys read than the
# graphed-prefill budget (cuda_graph_prefill_reads: 519 tokens read 134,940), so this
# prompt runs through the extend kernel; under LONG_EXTEND (short tiles); 512 + 7.
MEDIUM_PROMPT = 519
DECODE_TOKENS = 8  # what round 4's decoding requests generate
JOIN_STEP = 2  # round 4's prompt arrives when the others decode
# Round 5: most of its requests generate MANY_ROWS_TOKENS, the few that end early
# MANY_ROWS_EARLY; the prompt joins at step MANY_ROWS_JOIN, when the early ones have ended
# and the rest have decoded at least one step by themselves, with the overlap scheduler
# too (it notices an end a step late). 128 tokens: the shortest prompts of the
# benchmarks' batches (128/128), a multiple of 16 where round 4's prompt is not.
MANY_ROWS_TOKENS = 5
MANY_ROWS_EARLY = 2
MANY_ROWS_JOIN = 4
MANY_ROWS_PROMPT = 128
MAX_STEPS = 1000  # a round that runs longer is a bug (every round takes a few dozen)

_GREEDY = SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True)


def _decoding(**params: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=DECODE_TOKENS, ignore_eos=True, **params)


def _greedy(new_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)


# Round 4's decoding requests: every sampling path a step can take.
DECODING_PARAMS = (
    _decoding(temperature=0.0),
    _decoding(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05),
    _decoding(temperature=0.0, repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5),
    _decoding(temperature=1.0, seed=1, return_logprob=True, top_logprobs_num=3),
)


@dataclass(frozen=True)
class WarmupRequest:
    """One dummy request of a round: `prompt_len` tokens, the first of them those of an
    earlier request's prompt when `prefix` is (its index in the plan, flattened; how many
    tokens), added once its round has run `join_step` steps."""

    prompt_len: int
    params: SamplingParams = _GREEDY
    prefix: tuple[int, int] | None = None
    join_step: int = 0


def many_rows(running_cap: int, pool_tokens: int, page_size: int = 1) -> int:
    """Round 5's requests: the running cap (a decode row per running request, so the most
    a decode step runs), as far as a quarter of the pool holds them, each a one-token
    prompt and its MANY_ROWS_TOKENS (in whole pages)."""
    per_request = -(-(1 + MANY_ROWS_TOKENS) // page_size) * page_size
    return min(running_cap, pool_tokens // 4 // per_request)


def _fewer_rows(rows: int) -> int:
    """Round 5's decode rows once its early requests ended: of the other pattern Triton
    specializes an int on (a multiple of 16 or not) where `rows` allows one (1,024 ->
    1,023; 1,000 -> 992), else one fewer (at least one ends early: a row for the prompt
    under the running cap)."""
    if rows % 16 == 0 or rows < 16:
        return rows - 1
    return rows - rows % 16


def warmup_plan(
    token_budget: int,
    context_len: int,
    pool_tokens: int,
    running_cap: int = 0,
    page_size: int = 1,
) -> list[list[WarmupRequest]]:
    """The rounds of the module doc, for a worker with this token budget, context length,
    pool (usable tokens), running cap (0: no round 5) and page size. Empty when not even a
    one-token prompt fits."""
    cap = min(token_budget, context_len - DECODE_TOKENS - 1, pool_tokens // 4)
    if cap < 1:
        return []
    short = sorted({min(n, cap) for n in SHORT_PROMPTS})
    rounds = [[WarmupRequest(n)] for n in short]
    long, medium = cap, min(MEDIUM_PROMPT, cap)
    long_index = len(rounds)
    rounds += [[WarmupRequest(n)] for n in sorted({long, medium}, reverse=True)]
    half = long // 2
    rounds.append([WarmupRequest(half + min(MEDIUM_PROMPT, cap - half), prefix=(long_index, half))])
    decoding = [WarmupRequest(4 + i, params) for i, params in enumerate(DECODING_PARAMS)]
    rounds.append([*decoding, WarmupRequest(medium, join_step=JOIN_STEP)])
    rows = many_rows(running_cap, pool_tokens, page_size)
    if rows >= 2:
        fewer = _fewer_rows(rows)
        many = _greedy(MANY_ROWS_TOKENS)
        early = _greedy(MANY_ROWS_EARLY)
        prompt = min(MANY_ROWS_PROMPT, cap)
        rounds.append(
            [
                *(WarmupRequest(1, many) for _ in range(fewer)),
                *(WarmupRequest(1, early) for _ in range(rows - fewer)),
                WarmupRequest(prompt, join_step=MANY_ROWS_JOIN),
            ]
        )
    return rounds


@dataclass(frozen=True)
class WarmupStep:
    """One step the warm-up ran: (first position, new tokens) of each of its rows."""

    rows: tuple[tuple[int, int], ...]

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.rows)

    @property
    def mixed(self) -> bool:
        """Decode rows beside a prompt chunk."""
        return any(n == 1 for _, n in self.rows) and any(n > 1 for _, n in self.rows)

    @property
    def over_prefix(self) -> bool:
        """A chunk of several tokens after tokens already in the KV cache."""
        return any(start > 0 and n > 1 for start, n in self.rows)


@dataclass(frozen=True)
class WarmupReport:
    seconds: float
    steps: tuple[WarmupStep, ...]


def run_warmup(
    scheduler: Scheduler, plan: list[list[WarmupRequest]], vocab_size: int
) -> WarmupReport:
    """Run `plan` on `scheduler` (its runner wrapped to record the steps: the scheduler is
    spent afterwards), then reset its radix cache. Raises RuntimeError when a request did
    not finish or a slot or table row is still held afterwards."""
    recorder = _Recorder(scheduler.runner)
    scheduler.runner = recorder
    device = scheduler.allocator.device
    t0 = time.perf_counter()
    fork = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
    with fork, compile_phase("warmup"):  # a Triton compile log's label, when one is open
        prompts: list[list[int]] = []
        for requests in plan:
            _run_round(scheduler, requests, prompts, vocab_size)
    scheduler.cache.reset()
    _check_all_free(scheduler)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the last step's kernels are part of the warm-up
    return WarmupReport(time.perf_counter() - t0, tuple(recorder.steps))


def _run_round(
    scheduler: Scheduler, requests: list[WarmupRequest], prompts: list[list[int]], vocab: int
) -> None:
    waiting = sorted(requests, key=lambda r: r.join_step)
    started: list[Request] = []
    for step in range(MAX_STEPS):
        while waiting and waiting[0].join_step <= step:
            spec = waiting.pop(0)
            ids = _prompt(len(prompts), spec, prompts, vocab)
            prompts.append(ids)
            req = Request(rid=f"warmup-{len(prompts)}", prompt_ids=ids, params=spec.params)
            scheduler.add_request(req)
            started.append(req)
        if not waiting and not scheduler.has_work():
            break
        if scheduler.has_work():
            scheduler.step()
    else:
        raise RuntimeError(f"warm-up: a round did not finish in {MAX_STEPS} steps")
    for req in started:
        if req.finish_reason != FinishReason.LENGTH:
            raise RuntimeError(f"warm-up request {req.rid} ended {req.finish_reason}: {req.error}")


def _prompt(index: int, spec: WarmupRequest, prompts: list[list[int]], vocab: int) -> list[int]:
    """Token ids: request `index`'s own sequence (its first token differs from every other
    request's, so no two share a cached prefix by chance), after `spec.prefix`'s tokens."""
    head: list[int] = []
    if spec.prefix is not None:
        source, n = spec.prefix
        head = prompts[source][:n]
    own = [(index * 7919 + i * 104729 + 3) % vocab for i in range(spec.prompt_len - len(head))]
    return head + own


def _check_all_free(scheduler: Scheduler) -> None:
    allocator, table = scheduler.allocator, scheduler.req_table
    free, usable = allocator.num_free_slots, allocator.num_usable_slots
    rows, all_rows = table.num_free_rows, table.max_requests
    if free != usable or rows != all_rows:
        raise RuntimeError(
            f"warm-up left {usable - free} KV slots and {all_rows - rows} table rows held"
        )


class _Recorder:
    """The scheduler's runner, recording what each step computes."""

    def __init__(self, runner: ModelRunnerLike) -> None:
        self.runner = runner
        self.steps: list[WarmupStep] = []

    def forward(self, batch: Batch) -> ForwardOutput:
        self.steps.append(WarmupStep(tuple((it.start, it.num_new_tokens) for it in batch.items)))
        note_step(batch)
        return self.runner.forward(batch)
