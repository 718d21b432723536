"""Scheduler behaviour on the dummy:tiny model, with exact step-by-step assertions."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from radixmesh.worker.batch import Batch, Draft, ForwardOutput, ScheduledRequest
from radixmesh.worker.kvcache.req_table import ReqToTokenTable
from radixmesh.worker.request import FinishReason, Request
from tests.worker.factories import (
    Recorder,
    all_free_after_flush,
    assert_slots_accounted,
    make_request,
    make_worker,
    run_to_completion,
)

PROMPT_40 = list(range(10, 50))


def _run_alone(prompt: list[int], max_new: int, **opts: object) -> list[int]:
    w = make_worker(**opts)  # type: ignore[arg-type]
    r = make_request(w, prompt, max_new_tokens=max_new)
    w.scheduler.add_request(r)
    run_to_completion(w)
    return r.output_ids


def test_chunked_prefill_splits_the_prompt_by_the_token_budget() -> None:
    w = make_worker(max_num_batched_tokens=16)
    rec = Recorder().attach(w)
    r = make_request(w, PROMPT_40, rid="a", max_new_tokens=3)
    w.scheduler.add_request(r)
    run_to_completion(w)
    # 16 + 16 + 8 prompt tokens (the last chunk samples), then two decode steps.
    assert rec.steps == [[("a", 16)], [("a", 16)], [("a", 8)], [("a", 1)], [("a", 1)]]
    assert r.finish_reason is FinishReason.LENGTH
    assert r.output_ids == _run_alone(PROMPT_40, 3)
    assert all_free_after_flush(w)


def test_decode_rows_go_before_new_prefill_in_the_same_step() -> None:
    w = make_worker(max_num_batched_tokens=16)
    rec = Recorder().attach(w)
    a = make_request(w, list(range(10, 20)), rid="a", max_new_tokens=4)
    w.scheduler.add_request(a)
    w.scheduler.step()
    b = make_request(w, list(range(100, 130)), rid="b", max_new_tokens=2)
    w.scheduler.add_request(b)
    run_to_completion(w)
    # a decodes 1 token each step; b's 30-token prompt gets the other 15 of the budget.
    assert rec.steps[:3] == [[("a", 10)], [("a", 1), ("b", 15)], [("a", 1), ("b", 15)]]
    assert a.output_ids == _run_alone(list(range(10, 20)), 4)
    assert b.output_ids == _run_alone(list(range(100, 130)), 2)


def test_retraction_under_a_tiny_pool_keeps_output_and_frees_everything() -> None:
    prompts = [list(range(10 + 7 * i, 18 + 7 * i)) for i in range(3)]
    w = make_worker(kv_cache_tokens=48, new_token_ratio=0.0)
    reqs = [make_request(w, p, rid=f"q{i}", max_new_tokens=30) for i, p in enumerate(prompts)]
    for r in reqs:
        w.scheduler.add_request(r)
    run_to_completion(w)
    assert w.scheduler.stats().num_retractions > 0
    assert sum(r.num_retractions for r in reqs) == w.scheduler.stats().num_retractions
    for r, p in zip(reqs, prompts, strict=True):
        assert r.finish_reason is FinishReason.LENGTH
        assert r.output_ids == _run_alone(p, 30)
    assert all_free_after_flush(w)


def test_abort_mid_decode_returns_every_slot() -> None:
    w = make_worker()
    r = make_request(w, PROMPT_40, rid="x", max_new_tokens=50)
    other = make_request(w, list(range(60, 70)), rid="y", max_new_tokens=5)
    w.scheduler.add_request(r)
    w.scheduler.add_request(other)
    for _ in range(4):
        w.scheduler.step()
    assert r.num_output_tokens == 4
    assert w.scheduler.abort("x")
    assert_slots_accounted(w)
    assert r.finish_reason is FinishReason.ABORT
    last = r.outputs[-1]
    assert last.finished and last.meta_info.finish is not None
    assert last.meta_info.finish.reason == "abort"
    assert [q.rid for q in w.scheduler.running] == ["y"]
    run_to_completion(w)
    assert other.finish_reason is FinishReason.LENGTH
    assert all_free_after_flush(w)


def test_abort_of_a_waiting_request() -> None:
    w = make_worker(max_running_requests=1)
    a = make_request(w, [5, 6, 7], rid="a", max_new_tokens=5)
    b = make_request(w, [8, 9, 10], rid="b", max_new_tokens=5)
    w.scheduler.add_request(a)
    w.scheduler.add_request(b)
    w.scheduler.step()
    assert w.scheduler.abort("b")
    assert b.finish_reason is FinishReason.ABORT and b.num_output_tokens == 0
    assert not w.scheduler.abort("nope")
    run_to_completion(w)
    assert all_free_after_flush(w)


def _cache_prompt(w: object, prompt: list[int]) -> None:
    r = make_request(w, prompt, max_new_tokens=1)  # type: ignore[arg-type]
    w.scheduler.add_request(r)  # type: ignore[attr-defined]
    run_to_completion(w)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("lpm", ["b", "c", "a"]), ("fcfs", ["a", "b", "c"])],
)
def test_policy_admission_order(policy: str, expected: list[str]) -> None:
    w = make_worker(policy=policy, max_running_requests=1)
    cached = list(range(200, 232))
    _cache_prompt(w, cached)
    rec = Recorder().attach(w)
    for rid, prompt in (
        ("a", list(range(300, 308))),  # no match
        ("b", [*cached, 1, 2, 3, 4]),  # 32 cached
        ("c", [*cached[:16], 7, 7, 7, 7]),  # 16 cached
    ):
        w.scheduler.add_request(make_request(w, prompt, rid=rid, max_new_tokens=2))
    run_to_completion(w)
    assert rec.admission_order() == expected


def test_lpm_reuses_cache_and_reports_cached_tokens() -> None:
    w = make_worker()
    cached = list(range(200, 232))
    _cache_prompt(w, cached)
    rec = Recorder().attach(w)
    b = make_request(w, [*cached, 1, 2, 3, 4], rid="b", max_new_tokens=2)
    w.scheduler.add_request(b)
    run_to_completion(w)
    assert b.num_cached_tokens == 32
    assert rec.steps[0] == [("b", 4)]  # only the uncached suffix is computed
    assert b.outputs[-1].meta_info.cached_tokens == 32


def test_dfs_weight_runs_the_heavier_subtree_first() -> None:
    w = make_worker(policy="dfs-weight", max_running_requests=3)
    q, r = list(range(200, 216)), list(range(400, 424))
    _cache_prompt(w, q)
    _cache_prompt(w, r)
    rec = Recorder().attach(w)
    for rid, prompt in (("y1", [*r, 1]), ("x1", [*q, 2]), ("x2", [*q, 3])):
        w.scheduler.add_request(make_request(w, prompt, rid=rid, max_new_tokens=1))
    run_to_completion(w)
    # All three are admitted in one step, in the policy's order: q's subtree holds two
    # waiting requests and r's one, so q's go first although y1 arrived first.
    assert rec.admission_order() == ["x1", "x2", "y1"]


def test_cache_aware_policies_fall_back_to_fcfs_on_long_queues() -> None:
    w = make_worker(policy="lpm", max_running_requests=1, policy_fallback_queue_len=2)
    cached = list(range(200, 232))
    _cache_prompt(w, cached)
    rec = Recorder().attach(w)
    for rid, prompt in (("a", [300, 301]), ("b", [*cached, 1]), ("c", [5, 6])):
        w.scheduler.add_request(make_request(w, prompt, rid=rid, max_new_tokens=1))
    run_to_completion(w)
    assert rec.admission_order() == ["a", "b", "c"]


@pytest.mark.parametrize("page_size", [1, 4])
def test_shared_prefixes_across_concurrent_requests(page_size: int) -> None:
    w = make_worker(page_size=page_size, max_num_batched_tokens=24)
    base = list(range(300, 337))  # 37 tokens: not page aligned
    reqs = [make_request(w, [*base, i, i + 1], rid=f"s{i}", max_new_tokens=6) for i in range(4)]
    for r in reqs:
        w.scheduler.add_request(r)
    run_to_completion(w)
    for r in reqs:
        assert r.output_ids == _run_alone(list(r.prompt_ids), 6, page_size=page_size)
    # The first request's prefill was shared with the later ones.
    assert sum(r.num_cached_tokens for r in reqs) > 0
    assert all_free_after_flush(w)


def test_cache_off_gives_the_same_tokens_and_no_hits() -> None:
    prompt = list(range(400, 440))
    on = make_worker()
    off = make_worker(disable_radix_cache=True)
    for w in (on, off):
        for i in range(2):
            w.scheduler.add_request(make_request(w, prompt, rid=f"z{i}", max_new_tokens=5))
        run_to_completion(w)
    assert on.scheduler.stats().cache_hit_tokens > 0
    assert off.scheduler.stats().cache_hit_tokens == 0
    assert off.cache.total_size() == 0
    assert off.allocator.num_free_slots == off.allocator.num_usable_slots


def test_a_failed_step_aborts_everything_and_frees_its_slots() -> None:
    w = make_worker(max_num_batched_tokens=16)
    reqs = [
        make_request(w, list(range(10 + i, 40 + i)), rid=f"f{i}", max_new_tokens=8)
        for i in range(3)
    ]
    for r in reqs:
        w.scheduler.add_request(r)
    inner = w.runner.forward
    calls = {"n": 0}

    def flaky(batch: object) -> object:
        calls["n"] += 1
        if calls["n"] == 4:  # mid chunked prefill of some, after slots were allocated
            raise RuntimeError("device lost")
        return inner(batch)  # type: ignore[arg-type]

    w.scheduler.runner = type("R", (), {"forward": staticmethod(flaky)})()
    with pytest.raises(RuntimeError, match="device lost"):
        for _ in range(10):
            w.scheduler.step()
    w.scheduler.fail_all("internal error: device lost")
    assert all(r.finish_reason is FinishReason.ABORT for r in reqs)
    assert all(r.outputs[-1].error == "internal error: device lost" for r in reqs)
    assert not w.scheduler.has_work()
    assert w.cache.protected_size() == 0
    assert w.req_table.num_free_rows == 8
    assert_slots_accounted(w)
    assert all_free_after_flush(w)


@pytest.mark.parametrize("budget", [2048, 3])
def test_max_new_tokens_zero_prefills_caches_and_finishes(budget: int) -> None:
    w = make_worker(max_num_batched_tokens=budget)
    r = make_request(w, [5, 6, 7, 8, 9, 10, 11], rid="z", max_new_tokens=0)
    w.scheduler.add_request(r)
    steps = run_to_completion(w)
    assert steps == -(-7 // budget)
    assert r.finish_reason is FinishReason.LENGTH and r.output_ids == []
    assert w.cache.total_size() == 7  # the whole prompt is cached for whoever comes next


def test_prompt_logprobs_of_a_one_token_prompt() -> None:
    w = make_worker()
    r = make_request(w, [5], max_new_tokens=1, return_logprob=True, logprob_start_len=0)
    w.scheduler.add_request(r)
    run_to_completion(w)
    assert r.input_token_logprobs == [(None, 5, None)]


@pytest.mark.parametrize("page_size", [1, 4])
def test_batched_decode_allocation_matches_the_per_request_path(page_size: int) -> None:
    """Same slots every step with and without the batched decode path, through retractions."""

    def run(batched: bool) -> tuple[list[list[int]], list[list[int]], int]:
        w = make_worker(kv_cache_tokens=64, new_token_ratio=0.0, page_size=page_size)
        if not batched:
            w.scheduler._schedule_decode = lambda *args: False  # type: ignore[method-assign]
        slots: list[list[int]] = []
        inner = w.runner.forward

        def forward(batch: Batch) -> ForwardOutput:
            slots.append(batch.out_cache_loc.tolist())
            return inner(batch)

        w.scheduler.runner = _Forward(forward)
        reqs = [
            make_request(w, list(range(10 + 7 * i, 17 + 7 * i)), max_new_tokens=30)
            for i in range(3)
        ]
        for r in reqs:
            w.scheduler.add_request(r)
        run_to_completion(w)  # asserts slot accounting after every step
        assert all_free_after_flush(w)
        return slots, [r.output_ids for r in reqs], w.scheduler.stats().num_retractions

    batched, per_request = run(True), run(False)
    assert batched == per_request
    assert batched[2] > 0  # the pool is small enough to retract
    assert sum(len(s) == 3 for s in batched[0]) > 10  # and the batched path ran


@pytest.mark.parametrize("page_size", [1, 4])
def test_batched_steps_with_forced_tokens_match_the_per_request_path(page_size: int) -> None:
    """Rows that extend by several tokens (a jump-forward's forced tokens, appended after
    every third sampled token here) take the batched path at page_size 1 with the same
    slots as the per-request path; at page_size 4 the per-request path runs."""

    def run(batched: bool) -> tuple[list[list[int]], list[list[int]], int]:
        w = make_worker(kv_cache_tokens=256, new_token_ratio=0.0, page_size=page_size)
        sched = w.scheduler
        if not batched:
            sched._schedule_decode = lambda *args: False  # type: ignore[method-assign]
        hits: list[int] = []
        inner_decode = sched._schedule_decode

        def schedule_decode(
            running: list[Request],
            budget: int,
            items: list[ScheduledRequest],
            slots: list[torch.Tensor],
            drafts: dict[Request, Draft] | None = None,
        ) -> bool:
            ok = inner_decode(running, budget, items, slots, drafts)
            hits.extend(it.num_new_tokens for it in items if ok and it.num_new_tokens > 1)
            return ok

        sched._schedule_decode = schedule_decode  # type: ignore[method-assign]
        append = sched.output.append_token

        def append_forced(
            req: Request, token: int, logprob: float | None, top: list[tuple[int, float]] | None
        ) -> None:
            append(req, token, logprob, top)
            for k in (1, 2):  # like GrammarManager.append: stop once the request finished
                if req.finished or req.num_output_tokens % 4 not in (1, 2):
                    break
                append(req, (token + k) % 200 + 3, None, None)

        sched.output.append_token = append_forced  # type: ignore[method-assign]
        slots: list[list[int]] = []
        inner = w.runner.forward

        def forward(batch: Batch) -> ForwardOutput:
            slots.append(batch.out_cache_loc.tolist())
            return inner(batch)

        sched.runner = _Forward(forward)
        reqs = [
            make_request(w, list(range(10 + 7 * i, 17 + 7 * i)), max_new_tokens=30)
            for i in range(3)
        ]
        for r in reqs:
            sched.add_request(r)
        run_to_completion(w)  # asserts slot accounting after every step
        assert all_free_after_flush(w)
        return slots, [r.output_ids for r in reqs], len(hits)

    batched, per_request = run(True), run(False)
    assert batched[:2] == per_request[:2]
    assert [len(o) for o in batched[1]] == [30, 30, 30]
    assert per_request[2] == 0
    if page_size == 1:
        assert batched[2] >= 10  # rows with forced tokens went through the batched path
    else:
        assert batched[2] == 0


class _Forward:
    def __init__(self, fn: Callable[[Batch], ForwardOutput]) -> None:
        self.forward = fn


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_mirrored_table_gives_the_same_tokens(page_size: int) -> None:
    """The GPU's table path on the CPU: the model reads a device copy that only
    `sync_device` writes, so a staged write lost or misordered changes what attention
    reads. Shared prefixes, chunked prefill and retraction write every kind of span."""

    def run(mirrored: bool) -> list[list[int]]:
        w = make_worker(
            page_size=page_size, max_num_batched_tokens=24, kv_cache_tokens=96, new_token_ratio=0.0
        )
        if mirrored:
            t = ReqToTokenTable(
                w.req_table.max_requests, w.req_table.max_context_len, "cpu", mirrored=True
            )
            w.req_table = w.scheduler.req_table = w.runner.req_table = t
            w.scheduler.slots.req_table = t
        base = list(range(300, 337))
        reqs = [make_request(w, [*base, i, i + 1], max_new_tokens=20) for i in range(6)]
        for r in reqs:
            w.scheduler.add_request(r)
        while w.scheduler.has_work():
            w.scheduler.step()
            assert_slots_accounted(w)
            if mirrored:
                w.req_table.sync_device()
                assert torch.equal(w.req_table.table, w.req_table.host)
        assert w.scheduler.stats().num_retractions > 0 and w.scheduler.stats().cache_hit_tokens > 0
        assert all_free_after_flush(w)
        return [r.output_ids for r in reqs]

    assert run(mirrored=True) == run(mirrored=False)
