"""The start-up warm-up (worker/warmup.py): its plan for a GPU worker and a small one, and
on CPU with the switch on, that it runs every kind of step, leaves every slot, table row
and counter as a fresh worker has them, and changes no output."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.engine import Engine
from radixmesh.worker.warmup import (
    DECODING_PARAMS,
    JOIN_STEP,
    MANY_ROWS_EARLY,
    MANY_ROWS_JOIN,
    MANY_ROWS_TOKENS,
    WarmupRequest,
    WarmupStep,
    many_rows,
    warmup_plan,
)
from tests.worker.factories import make_worker

SHORT = [[WarmupRequest(n)] for n in (1, 2, 3, 5, 9, 16, 17, 48)]


def decoding(medium: int) -> list[WarmupRequest]:
    return [
        *(WarmupRequest(4 + i, params) for i, params in enumerate(DECODING_PARAMS)),
        WarmupRequest(medium, join_step=JOIN_STEP),
    ]


def many(rows: int, fewer: int, prompt: int = 128) -> list[WarmupRequest]:
    """Round 5: `rows` one-token prompts, `fewer` of them decoding to the end, and a prompt
    beside those."""
    params = {
        n: SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)
        for n in (MANY_ROWS_TOKENS, MANY_ROWS_EARLY)
    }
    return [
        *(WarmupRequest(1, params[MANY_ROWS_TOKENS]) for _ in range(fewer)),
        *(WarmupRequest(1, params[MANY_ROWS_EARLY]) for _ in range(rows - fewer)),
        WarmupRequest(prompt, join_step=MANY_ROWS_JOIN),
    ]


def test_plan_of_an_8b_model_on_a_gpu() -> None:
    # token budget 8,192, context 8,192, Llama-3-8B's FP8 pool on an H200, 1,024 running
    plan = warmup_plan(8192, 8192, 1_776_000, running_cap=1024)
    long = 8192 - 9  # the context less the decoding requests' tokens and one
    assert plan == [
        *SHORT,
        [WarmupRequest(long)],  # the extend kernel's long tiles
        [WarmupRequest(519)],  # its short tiles
        [WarmupRequest(4091 + 519, prefix=(8, 4091))],  # over half the long prompt
        decoding(519),
        many(1024, 1023),  # decode rows past the largest graph (512): 1,024, then 1,023
    ]
    assert warmup_plan(8192, 8192, 1_776_000)[:-1] == plan[:-2]  # no cap given: no round 5


def test_plan_of_a_small_pool_is_shorter() -> None:
    plan = warmup_plan(2048, 2048, 1023, running_cap=64)  # a quarter: 255 tokens a prompt
    assert plan == [
        *SHORT,
        [WarmupRequest(255)],  # the long and the medium prompt, one length now
        [WarmupRequest(127 + 128, prefix=(8, 127))],
        decoding(255),
        many(42, 32),  # 42 requests of 6 tokens in 255; then 32 rows, a multiple of 16
    ]
    assert warmup_plan(2048, 9, 1024) == []  # no room for a prompt beside the decoding
    assert warmup_plan(64, 64, 1024, running_cap=8)[-1] == many(8, 7, prompt=55)


@pytest.mark.parametrize(
    ("cap", "pool", "page", "rows"),
    [(1024, 1_776_000, 1, 1024), (64, 1023, 1, 42), (64, 1023, 4, 31), (64, 1023, 16, 15)],
)
def test_round_5_takes_the_running_cap_as_far_as_a_quarter_of_the_pool_holds(
    cap: int, pool: int, page: int, rows: int
) -> None:
    assert many_rows(cap, pool, page) == rows


def test_round_5_visits_both_patterns_of_its_row_count() -> None:
    for rows, fewer in ((1024, 1023), (1000, 992), (513, 512), (40, 32), (8, 7), (2, 1)):
        plan = warmup_plan(8192, 8192, 1_776_000, running_cap=rows)
        assert plan[-1] == many(rows, fewer)
    assert len(warmup_plan(8192, 8192, 1_776_000, running_cap=1)) == len(SHORT) + 4


def test_steps_are_described_by_their_rows() -> None:
    mixed = WarmupStep(((5, 1), (6, 1), (0, 256)))
    assert (mixed.num_tokens, mixed.mixed, mixed.over_prefix) == (258, True, False)
    prefix = WarmupStep(((128, 128),))
    assert (prefix.num_tokens, prefix.mixed, prefix.over_prefix) == (128, False, True)


def test_off_on_cpu_by_default() -> None:
    w = make_worker(device="cpu")
    assert w.config.model.warmup is None and w.warmup is None


@pytest.mark.parametrize(
    ("options", "over_prefix"),
    [
        ({}, [((128, 128),)]),  # round 3: 128 new tokens after the 128 cached
        ({"page_size": 4}, [((128, 128),)]),  # 128: whole pages
        ({"disable_radix_cache": True}, []),  # nothing cached: no step over a prefix
        ({"overlap_schedule": True}, [((128, 128),)]),
    ],
    ids=["default", "pages", "no-cache", "overlap"],
)
def test_warmup_runs_every_kind_of_step_and_frees_everything(
    options: dict[str, Any], over_prefix: list[tuple[tuple[int, int], ...]]
) -> None:
    w = make_worker(device="cpu", warmup=True, **options)  # 1,024 tokens: prompts to 256
    report = w.warmup
    assert report is not None and report.seconds > 0
    alone = {s.num_tokens for s in report.steps if len(s.rows) == 1 and s.rows[0][0] == 0}
    assert {1, 2, 3, 5, 9, 16, 17, 48, 256} <= alone
    assert any(s.mixed for s in report.steps)
    # round 5: the running cap's 8 rows, then 7, then 7 beside a 128-token chunk
    decode_rows = {len(s.rows) for s in report.steps if s.num_tokens == len(s.rows)}
    assert {8, 7} <= decode_rows
    assert any(s.mixed and s.num_tokens == 7 + 128 for s in report.steps)
    assert [s.rows for s in report.steps if s.over_prefix] == over_prefix
    a = w.allocator
    assert a.num_free_slots == a.num_usable_slots == 1024
    assert w.cache.total_size() == 0
    assert w.req_table.num_free_rows == w.config.scheduler.running_cap == 8
    stats = w.scheduler.stats()  # the serving scheduler ran none of it
    assert (stats.num_steps, stats.prompt_tokens, stats.generated_tokens) == (0, 0, 0)


def test_outputs_after_warmup_are_those_of_a_worker_without() -> None:
    prompts = [[(7 * i + j) % 500 + 3 for j in range(5 + 9 * i)] for i in range(6)]
    greedy = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
    sampled = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True}  # unseeded
    outs = {}
    for warmup in (True, False):
        with Engine(
            "dummy:tiny",
            device="cpu",
            dtype="float32",
            kv_cache_tokens=1024,
            max_running_requests=8,
            warmup=warmup,
        ) as eng:
            assert (eng.worker.warmup is not None) == warmup
            runs = []
            for params in (greedy, sampled):
                res = eng.generate(input_ids=prompts, sampling_params=params)
                assert isinstance(res, list)
                runs.append([r["output_ids"] for r in res])
            outs[warmup] = runs
    assert outs[True] == outs[False]
    assert len({tuple(ids) for ids in outs[True][0]}) > 1  # not one constant output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_warmup_is_on_by_default_on_cuda_and_frees_everything() -> None:
    w = make_worker(device="cuda", dtype="bfloat16", quantization="fp8", kv_cache_dtype="fp8")
    try:
        assert w.warmup is not None and any(s.mixed for s in w.warmup.steps)
        assert w.allocator.num_free_slots == w.allocator.num_usable_slots
        assert w.cache.total_size() == 0
    finally:
        w.close()
