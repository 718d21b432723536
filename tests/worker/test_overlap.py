"""Overlap scheduling (worker/overlap.py): the same tokens as the synchronous scheduler.

Each test runs one workload with overlap_schedule off and on and compares outputs
exactly, checking the slot accounting after every step and that the overlap run really
deferred tokens (a running request's last id was a placeholder between steps).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import torch

from radixmesh.worker import model_runner
from radixmesh.worker.batch import Batch, ForwardOutput, Launched
from radixmesh.worker.engine import Engine
from radixmesh.worker.overlap import OverlapLoop
from radixmesh.worker.request import FinishReason
from radixmesh.worker.sampler import Sampler
from radixmesh.worker.scheduler import Scheduler
from radixmesh.worker.worker import Worker
from tests.worker.conftest import assert_engine_idle_and_clean
from tests.worker.constrained.schemas import SCHEMAS, schema_requests
from tests.worker.factories import (
    RecordedRequest,
    Recorder,
    all_free_after_flush,
    assert_slots_accounted,
    make_request,
    make_worker,
)

Spec = tuple[list[int], dict[str, Any]]  # (prompt ids, sampling params)


def _prompt(seed: int, n: int) -> list[int]:
    return [(seed * 37 + i * 11) % 250 + 3 for i in range(n)]


def _run(
    overlap: bool, waves: list[list[Spec]], **opts: Any
) -> tuple[list[RecordedRequest], Worker, int]:
    """Run each wave to completion in turn; returns the requests, the worker and how many
    steps ended with a token still on the device."""
    w = make_worker(overlap_schedule=overlap, **opts)
    reqs: list[RecordedRequest] = []
    deferred = 0
    for wave in waves:
        for prompt, params in wave:
            r = make_request(w, prompt, **params)
            if r.params.constraint is not None:  # compiled before the steps: no step spins
                w.grammars.validate(r.params)
            w.scheduler.add_request(r)
            reqs.append(r)
        steps = 0
        while w.scheduler.has_work():
            w.scheduler.step()
            assert_slots_accounted(w)
            deferred += any(r.token_ids[-1] < 0 for r in w.scheduler.running)
            steps += 1
            assert steps < 1000
    return reqs, w, deferred


def _check_clean(w: Worker, reqs: list[RecordedRequest]) -> None:
    for r in reqs:
        assert r.finished
        assert min(r.token_ids) >= 0  # no placeholder left behind
        streamed = [t for out in r.outputs for t in out.new_token_ids]
        assert streamed == r.output_ids
        assert r.outputs[-1].finished
        assert r.outputs[-1].meta_info.completion_tokens == len(r.output_ids)
    assert w.cache.protected_size() == 0
    assert w.req_table.num_free_rows == w.config.scheduler.max_running_requests
    assert all_free_after_flush(w)


def _same(waves: list[list[Spec]], **opts: Any) -> tuple[list[RecordedRequest], Worker]:
    sync, w_sync, deferred_sync = _run(False, waves, **opts)
    over, w_over, deferred = _run(True, waves, **opts)
    assert deferred_sync == 0 and deferred > 0
    assert [r.output_ids for r in over] == [r.output_ids for r in sync]
    assert [r.finish_reason for r in over] == [r.finish_reason for r in sync]
    assert [r.matched_stop for r in over] == [r.matched_stop for r in sync]
    assert w_over.scheduler.stats().generated_tokens == w_sync.scheduler.stats().generated_tokens
    _check_clean(w_sync, sync)
    _check_clean(w_over, over)
    return over, w_over


def test_lengths_and_stop_tokens_match_the_synchronous_scheduler() -> None:
    # Learn some tokens the model emits, then stop on them.
    probe, _, _ = _run(False, [[(_prompt(1, 9), {"max_new_tokens": 12})]])
    stop_at = probe[0].output_ids[4]
    first = probe[0].output_ids.index(stop_at)
    wave: list[Spec] = [
        (_prompt(1, 9), {"max_new_tokens": 12, "stop_token_ids": [stop_at]}),
        (_prompt(2, 30), {"max_new_tokens": 1}),
        (_prompt(3, 5), {"max_new_tokens": 2}),
        (_prompt(4, 17), {"max_new_tokens": 23}),
        (_prompt(5, 3), {"max_new_tokens": 7}),
        (_prompt(1, 9), {"max_new_tokens": 12}),  # the same prompt: a cache hit
    ]
    over, _ = _same([wave])
    assert over[0].finish_reason is FinishReason.STOP and over[0].matched_stop == stop_at
    assert over[0].output_ids == probe[0].output_ids[: first + 1]
    assert [len(r.output_ids) for r in over[1:]] == [1, 2, 23, 7, 12]
    assert over[5].output_ids == probe[0].output_ids


def test_a_request_ending_by_its_length_gets_no_row_past_its_last_token() -> None:
    """The overlap scheduler computes exactly the tokens the synchronous one does when
    every request ends by max_new_tokens or the context length: no row for a token that
    would be dropped, and the same sequences cached."""

    def computed(overlap: bool) -> tuple[list[RecordedRequest], Worker, int]:
        w = make_worker(overlap_schedule=overlap, context_length=48)
        rec = Recorder().attach(w)
        reqs = []
        for i, (n, new) in enumerate([(9, 12), (30, 1), (5, 2), (17, 23), (40, 50), (3, 7)]):
            r = make_request(w, _prompt(i + 1, n), max_new_tokens=new, ignore_eos=True)
            w.scheduler.add_request(r)
            reqs.append(r)
        while w.scheduler.has_work():
            w.scheduler.step()
            assert_slots_accounted(w)
        _check_clean(w, reqs)
        return reqs, w, rec.computed_tokens()

    sync, w_sync, rows_sync = computed(False)
    over, w_over, rows_over = computed(True)
    assert [r.output_ids for r in over] == [r.output_ids for r in sync]
    assert [len(r.output_ids) for r in over] == [12, 1, 2, 23, 8, 7]  # 40 + 8 = context
    assert rows_over == rows_sync == sum(r.num_prompt_tokens + len(r.output_ids) - 1 for r in sync)
    assert w_over.cache.total_size() == w_sync.cache.total_size()


def test_chunked_prefill_and_a_second_wave_of_cache_hits() -> None:
    wave1: list[Spec] = [(_prompt(i, 40 + 7 * i), {"max_new_tokens": 6 + i}) for i in range(4)]
    # Second wave: each first-wave sequence (prompt + output) continued by a few tokens.
    probe, _, _ = _run(False, [wave1], max_num_batched_tokens=32)
    wave2: list[Spec] = [
        (r.token_ids + _prompt(9 + i, 3), {"max_new_tokens": 5}) for i, r in enumerate(probe)
    ]
    over, _ = _same([wave1, wave2], max_num_batched_tokens=32)
    # Each first-wave sequence is cached but for its last output token, which no step
    # computed (they end by length): at least the prompt and all but one output token.
    for first, second in zip(over[:4], over[4:], strict=True):
        assert second.num_cached_tokens >= first.num_prompt_tokens + len(first.output_ids) - 1


def test_pages_of_four_and_the_context_length() -> None:
    wave: list[Spec] = [
        (_prompt(1, 20), {"max_new_tokens": 50}),  # ends at the context length (32)
        (_prompt(2, 5), {"max_new_tokens": 9}),
        (_prompt(3, 11), {"max_new_tokens": 14}),
    ]
    over, _ = _same([wave], page_size=4, context_length=32)
    assert [len(r.token_ids) for r in over] == [32, 14, 25]
    assert [r.finish_reason for r in over] == [FinishReason.LENGTH] * 3


def test_retraction_under_memory_pressure() -> None:
    wave: list[Spec] = [(_prompt(i, 12), {"max_new_tokens": 40}) for i in range(5)]
    over, w = _same([wave], kv_cache_tokens=128, new_token_ratio=0.0)
    assert w.scheduler.stats().num_retractions > 0
    assert sum(r.num_retractions for r in over) == w.scheduler.stats().num_retractions


def test_host_bound_requests_make_steps_synchronous_and_match() -> None:
    wave: list[Spec] = [
        (_prompt(1, 8), {"max_new_tokens": 9}),
        (_prompt(2, 6), {"max_new_tokens": 5, "return_logprob": True, "top_logprobs_num": 2}),
        (_prompt(3, 7), {"max_new_tokens": 6, "frequency_penalty": 0.5}),
        (_prompt(4, 5), {"max_new_tokens": 0}),
    ]
    # A plain first wave so that the second wave's host-bound requests arrive while a
    # token is on the device.
    over, _ = _same([[(_prompt(5, 6), {"max_new_tokens": 8})], wave])
    sync, _, _ = _run(False, [[(_prompt(5, 6), {"max_new_tokens": 8})], wave])
    assert over[2].output_token_logprobs == sync[2].output_token_logprobs
    assert over[2].output_top_logprobs == sync[2].output_top_logprobs
    assert len(over[2].output_token_logprobs) == 5
    assert over[4].output_ids == [] and over[4].finish_reason is FinishReason.LENGTH


def test_sampled_rows_draw_after_the_next_step_is_built_and_match(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seeded sampled requests (temperature, top-k, top-p, min-p, logit_bias) beside greedy
    ones, one ending on a stop id: the overlap scheduler defers their draws (each runs
    after the next step is scheduled, before it is launched) and gets the synchronous
    scheduler's tokens."""
    probe, _, _ = _run(False, [[(_prompt(7, 11), {"max_new_tokens": 10})]])
    stop_at = probe[0].output_ids[5]
    sampled = {"temperature": 0.9, "top_k": 40, "top_p": 0.9}
    wave: list[Spec] = [
        (_prompt(1, 9), {**sampled, "seed": 11, "max_new_tokens": 14}),
        (_prompt(2, 13), {"temperature": 1.3, "seed": 12, "max_new_tokens": 9, "min_p": 0.05}),
        (_prompt(3, 6), {"max_new_tokens": 20}),
        (_prompt(4, 8), {**sampled, "seed": 13, "max_new_tokens": 12, "logit_bias": {5: 2.0}}),
        (_prompt(7, 11), {"max_new_tokens": 10, "stop_token_ids": [stop_at]}),
    ]
    deferred: list[bool] = []
    real = model_runner.ModelRunner.forward

    def forward(self: model_runner.ModelRunner, batch: Any) -> Any:
        out = real(self, batch)
        deferred.append(out.pending_draw is not None)
        return out

    monkeypatch.setattr(model_runner.ModelRunner, "forward", forward)
    over, _ = _same([wave])
    assert any(deferred) and not all(deferred)  # the last steps run greedy rows alone
    assert over[4].finish_reason is FinishReason.STOP and over[4].matched_stop == stop_at
    assert [len(r.output_ids) for r in over[:4]] == [14, 9, 20, 12]
    assert len(set(over[0].output_ids)) > 1  # sampled, not one repeated token


def test_penalties_and_min_new_tokens_overlap_and_read_every_output_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Penalties and min_new_tokens read a row's output ids; the overlap scheduler draws
    such a row after the previous step's token is on the host, so it counts every id
    (the outputs equal the synchronous scheduler's, where missing the last id would
    repeat it) and the steps still overlap."""
    probe, _, _ = _run(False, [[(_prompt(6, 10), {"max_new_tokens": 8})]])
    early = probe[0].output_ids[1]  # a stop id the model emits at once
    wave: list[Spec] = [
        (_prompt(1, 9), {"max_new_tokens": 16, "presence_penalty": 1.5}),
        (_prompt(2, 7), {"max_new_tokens": 14, "frequency_penalty": 0.8}),
        (_prompt(3, 12), {"max_new_tokens": 15, "repetition_penalty": 1.4}),
        (
            _prompt(6, 10),
            {"max_new_tokens": 12, "min_new_tokens": 6, "stop_token_ids": [early]},
        ),
        (_prompt(4, 8), {"temperature": 0.8, "seed": 5, "max_new_tokens": 13,
                         "frequency_penalty": 0.5, "presence_penalty": 0.5}),
    ]  # fmt: skip
    seen: list[tuple[object, tuple[int, ...]]] = []  # (the row's prompt, its output ids)
    real_draw = Sampler.draw

    def draw(self: Sampler, logits: torch.Tensor, rows: Any, *a: Any, **kw: Any) -> Any:
        seen.extend((r.prompt_ids, tuple(r.output_ids)) for r in rows if r.output_ids)
        return real_draw(self, logits, rows, *a, **kw)

    monkeypatch.setattr(Sampler, "draw", draw)
    over, _ = _same([wave])
    # Each draw of a penalized row of the overlap run read exactly the ids the request had
    # output before it: 1, 2, 3, ... of them, each a prefix of its final output.
    for r in over[:3]:
        drawn = [ids for prompt, ids in seen if prompt is r.prompt_ids]
        assert drawn == [tuple(r.output_ids[:n]) for n in range(1, len(r.output_ids))]
    plain, _, _ = _run(False, [[(p, {"max_new_tokens": 16}) for p, _ in wave[:3]]])
    # The penalties change what greedy decoding emits, so counting the wrong ids shows.
    for o, p in zip(over[:3], plain, strict=True):
        assert o.output_ids != p.output_ids[: len(o.output_ids)]
    assert [len(r.output_ids) for r in over[:3]] == [16, 14, 15]
    assert len(over[0].output_ids) == len(set(over[0].output_ids))  # presence: no repeat
    assert len(over[3].output_ids) >= 6 and early not in over[3].output_ids[:5]


def test_logprob_requests_overlap_and_get_the_synchronous_logprobs() -> None:
    """Requests that return logprobs (top ones too, prompt ones from a start) no longer
    make steps synchronous: `_same` asserts some steps kept a token on the device, and
    every logprob equals the synchronous scheduler's."""
    wave: list[Spec] = [
        (_prompt(1, 9), {"max_new_tokens": 10, "return_logprob": True, "top_logprobs_num": 3}),
        (_prompt(2, 12), {"max_new_tokens": 7, "return_logprob": True, "temperature": 0.9,
                          "seed": 4, "logprob_start_len": 5}),
        (_prompt(3, 6), {"max_new_tokens": 12, "return_logprob": True}),
    ]  # fmt: skip
    over, _ = _same([wave])
    sync, _, _ = _run(False, [wave])
    for o, s in zip(over, sync, strict=True):
        assert o.output_token_logprobs == s.output_token_logprobs
        assert o.output_top_logprobs == s.output_top_logprobs
        assert o.input_token_logprobs == s.input_token_logprobs
    assert [len(r.output_token_logprobs) for r in over] == [10, 7, 12]
    assert len(over[1].input_token_logprobs) == 12 - 5


def test_prefill_only_requests_overlap_through_chunked_prompts() -> None:
    """max_new_tokens 0 requests (a program's scoring: prompt logprobs, no output) beside
    decoding ones: their prompts take several chunks while other steps are in flight,
    and nothing makes the steps synchronous."""
    wave: list[Spec] = [
        (_prompt(1, 70), {"max_new_tokens": 0, "return_logprob": True, "logprob_start_len": 0}),
        (_prompt(2, 9), {"max_new_tokens": 20}),
        (_prompt(3, 45), {"max_new_tokens": 0}),
        (_prompt(4, 6), {"max_new_tokens": 9, "temperature": 0.8, "seed": 2}),
    ]
    over, _ = _same([wave], max_num_batched_tokens=24)
    sync, _, _ = _run(False, [wave], max_num_batched_tokens=24)
    assert [len(r.output_ids) for r in over] == [0, 20, 0, 9]
    assert [r.finish_reason for r in over] == [FinishReason.LENGTH] * 4
    assert over[0].input_token_logprobs == sync[0].input_token_logprobs
    assert len(over[0].input_token_logprobs) == 70
    # The prompts' chunks are scheduled while the others decode (not held back until no
    # step is in flight): both prefill-only requests end before the 20-token one does.
    w = make_worker(overlap_schedule=True, max_num_batched_tokens=24)
    reqs = [make_request(w, p, **params) for p, params in wave]
    for r in reqs:
        w.scheduler.add_request(r)
    ended: list[int] = []
    while w.scheduler.has_work():
        ended += [reqs.index(r) for r in w.scheduler.step()]  # type: ignore[arg-type]
    assert ended.index(0) < ended.index(1) and ended.index(2) < ended.index(1)


def test_constrained_requests_overlap_with_token_slots_and_not_with_pages() -> None:
    """Regex requests with jump-forward (dummy:tiny's byte tokenizer) against the
    synchronous scheduler: with page_size 1 the steps overlap; with pages a request's
    jump under a step in flight could not hand back one slot, so its steps are
    synchronous while it runs."""
    wave: list[Spec] = [
        (_prompt(1, 9), {"max_new_tokens": 30, "regex": r"user-[0-9]{4}-(ok|fail)"}),
        (_prompt(2, 7), {"max_new_tokens": 30, "regex": r"id: [a-z]{3}, done"}),
    ]
    over, w = _same([wave])  # it asserts that steps kept tokens on the device
    assert over[0].finish_reason is FinishReason.STOP and over[1].finish_reason is FinishReason.STOP
    paged = make_worker(overlap_schedule=True, page_size=4)
    paged.scheduler.add_request(make_request(paged, _prompt(1, 9), **wave[0][1]))
    assert paged.scheduler.needs_host_tokens()
    assert not w.scheduler.needs_host_tokens()


def test_the_loop_draws_step_n_after_building_step_n_plus_1() -> None:
    """The order the overlap loop runs a step's parts in, with a sampled step in flight:
    schedule(n+1) -> draw(n) -> launch(n+1) -> process_output(n)."""
    calls: list[str] = []

    class Steps:
        n = 0

        def schedule(self) -> Batch | None:
            self.n += 1
            calls.append(f"schedule {self.n}")
            return Batch(items=[], out_cache_loc=torch.empty(0)) if self.n <= 3 else None

        def launch(self, batch: Batch) -> Launched:
            calls.append(f"launch {self.n}")
            out = ForwardOutput.empty(0)
            step = self.n
            out.pending_draw = lambda: calls.append(f"draw {step}")
            return Launched(batch, out, [], [])

        def process_output(self, launched: Launched) -> list[Any]:
            launched.out.draw()  # as Scheduler.process_output: a no-op once drawn
            calls.append("process_output")
            return []

        def step_sync(self) -> list[Any]:
            raise AssertionError("no host-bound request here")

        def needs_host_tokens(self) -> bool:
            return False

    loop = OverlapLoop(Steps())
    for _ in range(4):
        loop.step()
    assert calls == [
        "schedule 1", "launch 1",
        "schedule 2", "draw 1", "launch 2", "process_output",
        "schedule 3", "draw 2", "launch 3", "process_output",
        "schedule 4", "draw 3", "process_output",
    ]  # fmt: skip


def test_abort_mid_run_frees_everything_and_leaves_the_others_unchanged() -> None:
    specs: list[Spec] = [(_prompt(i, 6 + i), {"max_new_tokens": 15}) for i in range(4)]
    sync, _, _ = _run(False, [specs])
    w = make_worker(overlap_schedule=True)
    reqs = [make_request(w, p, **params) for p, params in specs]
    for r in reqs:
        w.scheduler.add_request(r)
    for _ in range(4):
        w.scheduler.step()
    assert reqs[1].token_ids[-1] < 0  # its last token is still on the device
    assert w.scheduler.abort(reqs[1].rid)
    assert_slots_accounted(w)
    while w.scheduler.has_work():
        w.scheduler.step()
        assert_slots_accounted(w)
    assert reqs[1].finish_reason is FinishReason.ABORT
    assert reqs[1].output_ids == sync[1].output_ids[: len(reqs[1].output_ids)]
    assert 0 < len(reqs[1].output_ids) < 15
    assert [r.output_ids for i, r in enumerate(reqs) if i != 1] == [
        r.output_ids for i, r in enumerate(sync) if i != 1
    ]
    _check_clean(w, reqs)


def test_aborts_while_draws_are_deferred_free_everything() -> None:
    """A constrained request and a seeded, penalized sampled one aborted while their
    step's draw has not run yet (the overlap loop runs it after building the next step):
    the draw skips them, every slot comes back, the others keep the synchronous
    scheduler's tokens."""
    specs: list[Spec] = [
        (_prompt(1, 8), {"max_new_tokens": 30, "regex": r"user-[0-9]{4}-(ok|fail)"}),
        (_prompt(2, 9), {"max_new_tokens": 15, "temperature": 0.9, "seed": 3,
                         "frequency_penalty": 0.7}),
        (_prompt(3, 7), {"max_new_tokens": 15, "temperature": 0.8, "seed": 8, "top_p": 0.9}),
        (_prompt(4, 6), {"max_new_tokens": 15}),
    ]  # fmt: skip
    sync, _, _ = _run(False, [specs])
    w = make_worker(overlap_schedule=True)
    reqs = [make_request(w, p, **params) for p, params in specs]
    for r in reqs:
        if r.params.constraint is not None:
            w.grammars.validate(r.params)
        w.scheduler.add_request(r)
    for _ in range(4):
        w.scheduler.step()
    pending = w.scheduler._overlap.inflight  # type: ignore[union-attr]
    assert pending is not None and pending.out.pending_draw is not None  # not drawn yet
    assert w.scheduler.abort(reqs[0].rid) and w.scheduler.abort(reqs[1].rid)
    assert_slots_accounted(w)
    while w.scheduler.has_work():
        w.scheduler.step()
        assert_slots_accounted(w)
    assert [r.finish_reason for r in reqs[:2]] == [FinishReason.ABORT] * 2
    for r, s in zip(reqs[:2], sync[:2], strict=True):
        assert r.output_ids == s.output_ids[: len(r.output_ids)]
    assert [r.output_ids for r in reqs[2:]] == [r.output_ids for r in sync[2:]]
    _check_clean(w, reqs)


@pytest.mark.slow
def test_tensor_parallel_followers_get_the_resolved_ids() -> None:
    """tp 2 (gloo): rank 0 sends the ids still on its device in the step's broadcast."""
    opts: dict[str, Any] = dict(
        dtype="float32", kv_cache_tokens=2048, max_running_requests=8, max_num_batched_tokens=64
    )
    prompts = [[1 + (7 * i + 3 * j) % 500 for j in range(5 + 11 * i)] for i in range(6)]
    params = [
        {"temperature": 0.0, "max_new_tokens": 3 + 2 * i, "ignore_eos": True} for i in range(6)
    ]
    ref = Engine("dummy:tiny", **opts)
    try:
        want = ref.generate(input_ids=prompts, sampling_params=params)
    finally:
        ref.shutdown()
    eng = Engine("dummy:tiny", tp_size=2, overlap_schedule=True, **opts)
    try:
        got = eng.generate(input_ids=prompts, sampling_params=params)
        again = eng.generate(input_ids=prompts, sampling_params=params)  # cache hits
        assert isinstance(want, list) and isinstance(got, list) and isinstance(again, list)
        assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
        assert [o["output_ids"] for o in again] == [o["output_ids"] for o in want]
        assert [len(o["output_ids"]) for o in got] == [3, 5, 7, 9, 11, 13]
        assert all(o["meta_info"]["cached_tokens"] > 0 for o in again)
        assert_engine_idle_and_clean(eng)
    finally:
        eng.shutdown()


# ---- the bundled model, through the Engine ----------------------------------------------

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
]


@pytest.fixture(scope="module")
def overlap_engine(smollm2_gguf: object) -> Iterator[Engine]:
    eng = Engine(
        "smollm2",
        dtype="float32",
        kv_cache_tokens=8192,
        max_running_requests=16,
        overlap_schedule=True,
    )
    yield eng
    eng.shutdown()


@pytest.mark.slow
def test_smollm2_overlap_matches_sync_with_stops_eos_and_cache_hits(
    engine: Engine, overlap_engine: Engine
) -> None:
    chat = engine.tokenizer.encode_chat([{"role": "user", "content": "Say hi in one word."}])
    probe = engine.generate(PROMPTS[2], {"temperature": 0.0, "max_new_tokens": 24})
    assert isinstance(probe, dict)
    stop = probe["text"][8:14]  # spans tokens
    params: list[dict[str, Any]] = [
        {"temperature": 0.0, "max_new_tokens": 24, "stop": [stop]},
        {"temperature": 0.0, "max_new_tokens": 3},
        {"temperature": 0.0, "max_new_tokens": 17},
        {"temperature": 0.0, "max_new_tokens": 9},
        {"temperature": 0.0, "max_new_tokens": 1},
    ]
    prompts = [PROMPTS[2], PROMPTS[0], PROMPTS[1], PROMPTS[3], PROMPTS[4]]
    results = []
    for eng in (engine, overlap_engine):
        eng.flush_cache()
        batch = eng.generate(prompts, params)
        eos = eng.generate(input_ids=chat, sampling_params={"temperature": 0.0})
        again = eng.generate(prompts, params)  # cache hits
        assert isinstance(batch, list) and isinstance(again, list) and isinstance(eos, dict)
        results.append((batch, eos, again))
        assert_engine_idle_and_clean(eng)
    (b0, e0, a0), (b1, e1, a1) = results
    for x, y in ((b0, b1), (a0, a1), ([e0], [e1])):
        assert [o["output_ids"] for o in y] == [o["output_ids"] for o in x]
        assert [o["text"] for o in y] == [o["text"] for o in x]
        assert [o["meta_info"]["finish_reason"] for o in y] == [
            o["meta_info"]["finish_reason"] for o in x
        ]
    assert b1[0]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert e1["meta_info"]["finish_reason"]["type"] == "stop"  # the model's EOS
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in a1)


@pytest.mark.slow
def test_smollm2_overlap_stream_close_aborts_and_a_regex_matches_sync(
    overlap_engine: Engine, engine: Engine
) -> None:
    stream = overlap_engine.generate(
        PROMPTS[0], {"temperature": 0.0, "max_new_tokens": 64}, stream=True
    )
    assert isinstance(stream, Iterator)
    got = [next(stream) for _ in range(3)]
    assert all(chunk["output_ids"] for chunk in got)
    stream.close()  # aborts the request
    regex = {"temperature": 0.0, "max_new_tokens": 16, "regex": "(yes|no), [a-z]+"}
    want = engine.generate(PROMPTS[3], regex)
    out = overlap_engine.generate(PROMPTS[3], regex)
    assert isinstance(out, dict) and isinstance(want, dict)
    assert out["output_ids"] == want["output_ids"]
    assert_engine_idle_and_clean(overlap_engine)


@pytest.mark.slow
def test_smollm2_overlap_json_with_jump_forward_matches_sync(
    engine: Engine, overlap_engine: Engine
) -> None:
    """Constrained requests no longer make steps synchronous: each row's mask is filled
    when its draw runs (after the previous token was accepted), and where jump-forward
    appends forced text (or retokenizes the sampled token) under a step in flight, that
    step's row is dropped and the forced tokens computed next. Same greedy JSON as the
    synchronous engine, forced tokens and all, with no slot leaked."""
    names = [*SCHEMAS][:8]
    prompts, params = schema_requests(engine.tokenizer, names)
    want = engine.generate(prompts, params)
    got = overlap_engine.generate(prompts, params)
    assert isinstance(want, list) and isinstance(got, list)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    forced = [o["meta_info"]["forced_tokens"] for o in got]
    assert forced == [o["meta_info"]["forced_tokens"] for o in want] and min(forced) > 0
    for name, out in zip(names, got, strict=True):
        jsonschema.validate(json.loads(out["text"]), SCHEMAS[name])
    assert overlap_engine.worker.scheduler.needs_host_tokens() is False
    assert_engine_idle_and_clean(overlap_engine)


@pytest.mark.slow
def test_smollm2_overlap_retokenized_jumps_match_sync(
    engine: Engine, overlap_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regexes whose forced text merges with the sampled token (`com` + `puter`): the
    jump replaces the token whose KV the step in flight computes, so the request takes
    that token back (its slot too) and computes the replacement. The outputs are the
    synchronous engine's, and every slot is accounted for after."""
    kept: list[bool] = []
    real = Scheduler._jumped_under_a_step

    def jumped(self: Scheduler, req: Any, pos: int, was_kept: bool) -> None:
        kept.append(was_kept)
        real(self, req, pos, was_kept)

    monkeypatch.setattr(Scheduler, "_jumped_under_a_step", jumped)
    rxs = ["(con|com)puter [a-z]+", "The (in|im)portant (thing|point) is [a-z]+",
           "(un|in)der the (ta|tr)ble"]  # fmt: skip
    params = [{"temperature": 0.0, "max_new_tokens": 24, "regex": r} for r in rxs]
    want = engine.generate(["Say something:"] * 3, params)
    got = overlap_engine.generate(["Say something:"] * 3, params)
    assert isinstance(want, list) and isinstance(got, list)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert False in kept  # a jump under a step in flight replaced its token
    assert_engine_idle_and_clean(overlap_engine)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_overlap_matches_sync() -> None:
    """On CUDA the forward really runs behind the host: pinned non-blocking copies, the
    future buffer read by replayed decode graphs, one event per step."""
    prompts = [[(7 * i + j) % 500 + 3 for j in range(5 + 9 * i)] for i in range(11)]
    params = [
        {"temperature": 0.0, "max_new_tokens": 4 + 3 * i, "ignore_eos": True} for i in range(11)
    ]
    outs = {}
    for overlap in (False, True):
        eng = Engine(
            "dummy:tiny",
            device="cuda",
            dtype="float32",
            attention_backend="triton",
            cuda_graph_max_batch_size=32,
            kv_cache_tokens=4096,
            max_running_requests=32,
            overlap_schedule=overlap,
        )
        try:
            res = eng.generate(input_ids=prompts, sampling_params=params)
            again = eng.generate(input_ids=prompts, sampling_params=params)  # cache hits
            assert isinstance(res, list) and isinstance(again, list)
            assert [r["output_ids"] for r in again] == [r["output_ids"] for r in res]
            outs[overlap] = [r["output_ids"] for r in res]
            graphs = eng.worker.runner.decode_graphs
            assert graphs is not None and graphs.num_replays >= 60
            assert_engine_idle_and_clean(eng)
        finally:
            eng.shutdown()
    assert [len(o) for o in outs[True]] == [4 + 3 * i for i in range(11)]
    assert outs[True] == outs[False]
