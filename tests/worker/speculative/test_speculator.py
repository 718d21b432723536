"""Speculative decoding in the scheduler (dummy:tiny, float32, CPU): which requests draft,
the adaptive rest, and whole runs against plain decoding: the same tokens and logprobs,
every KV slot accounted for after every step, through retractions, aborts, overlap."""

from __future__ import annotations

import random
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.config import SpeculativeConfig
from radixmesh.worker.request import FinishReason, Request
from radixmesh.worker.speculative.speculator import Speculator
from radixmesh.worker.worker import Worker
from tests.worker.factories import (
    RecordedRequest,
    all_free_after_flush,
    assert_slots_accounted,
    make_request,
    make_worker,
    run_to_completion,
)

# A gap this small between the two best logits is a tie that float rounding decides: the
# extend-shaped verify row and the decode row may break it differently.
NEAR_TIE = 1e-4


class _Fixed:
    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, req: Request, k: int) -> list[int]:
        return self.tokens[:k]


def _decoding(prompt: list[int], out: list[int], **params: Any) -> Request:
    req = Request(rid=f"r{len(prompt)}", prompt_ids=prompt, params=SamplingParams(**params))
    req.token_ids.extend(out)
    req.num_computed_tokens = len(req.token_ids) - 1
    return req


def test_who_drafts_and_how_many() -> None:
    cfg = SpeculativeConfig(speculative="ngram", speculative_tokens=4, speculative_max_batch_size=3)
    spec = Speculator(cfg, _Fixed([7, 7, 7, 7, 7, 7]), context_len=100)
    decoding = _decoding([1, 2, 3], [4], max_new_tokens=50)
    near_limit = _decoding([1, 2], [4, 5], max_new_tokens=4)  # 2 more: 1 draft + 1
    at_context = _decoding(list(range(96)), [4], max_new_tokens=50)  # 97 of 100: 2 drafts
    prefilling = Request(rid="p", prompt_ids=[1, 2, 3], params=SamplingParams())
    opted_out = _decoding([1, 2, 3, 4], [4], speculative=False)
    pending = _decoding([1, 2, 3, 4, 5], [-1])  # its last token is still on the device
    drafts = {r: d.tokens for r, d in spec.drafts([decoding, near_limit, at_context]).items()}
    assert drafts == {decoding: [7, 7, 7, 7], near_limit: [7], at_context: [7, 7]}
    assert spec.drafts([prefilling, opted_out, pending]) == {}
    assert spec.may_draft([decoding]) and not spec.may_draft([opted_out])
    four = [decoding, near_limit, at_context, opted_out]
    assert spec.drafts(four) == {} and not spec.may_draft(four)  # above the batch limit
    last_token = _decoding([1, 2], [4, 5, 6], max_new_tokens=4)  # one to go: no draft
    assert spec.drafts([last_token]) == {}


def test_a_rejected_request_rests_longer_each_time() -> None:
    cfg = SpeculativeConfig(speculative="ngram", speculative_min_accept_rate=0.5)
    spec = Speculator(cfg, _Fixed([7]), context_len=1000)
    req = _decoding([1, 2, 3], [4], max_new_tokens=500)
    spec.record(req, 4, 4)
    assert spec.may_draft([req])
    spec.record(req, 4, 0)  # average 1.0 -> 0.7
    spec.record(req, 4, 0)  # -> 0.49: rests 8 output tokens
    assert not spec.may_draft([req]) and spec.drafts([req]) == {}
    req.token_ids.extend([5] * 8)
    req.num_computed_tokens = len(req.token_ids) - 1
    assert spec.may_draft([req])
    spec.record(req, 4, 0)
    spec.record(req, 4, 0)  # rests 16 now
    req.token_ids.extend([5] * 15)
    assert not spec.may_draft([req])
    req.token_ids.append(5)
    assert spec.may_draft([req])
    s = spec.stats
    assert (s.verify_steps, s.drafted_tokens, s.accepted_tokens) == (5, 20, 4)
    assert s.accept_lengths == [4, 0, 0, 0, 1]
    assert (req.spec_verify_steps, req.spec_drafted_tokens, req.spec_accepted_tokens) == (5, 20, 4)


def test_refused_where_it_cannot_run() -> None:
    with pytest.raises(InvalidArgument) as e:
        make_worker(speculative="ngram", deterministic=True)
    assert e.value.field == "speculative"
    with pytest.raises(InvalidArgument) as e:
        make_worker(speculative="ngram", page_size=4)
    assert e.value.field == "speculative"
    with pytest.raises(InvalidArgument) as e:
        SpeculativeConfig(speculative="medusa")
    assert e.value.field == "speculative"


def test_the_method_and_its_model_in_one_option() -> None:
    cfg = SpeculativeConfig(speculative="draft:dummy:llama-3.2-1b")
    assert (cfg.speculative, cfg.speculative_draft_model) == ("draft", "dummy:llama-3.2-1b")
    cfg = SpeculativeConfig(
        speculative="eagle:/models/head", speculative_draft_model="/models/head"
    )
    assert (cfg.speculative, cfg.speculative_draft_model) == ("eagle", "/models/head")
    with pytest.raises(InvalidArgument) as e:
        SpeculativeConfig(speculative="draft:a", speculative_draft_model="b")
    assert e.value.field == "speculative_draft_model" and "'b' differs" in e.value.message
    with pytest.raises(InvalidArgument) as e:
        SpeculativeConfig(speculative="draft:")
    assert e.value.field == "speculative" and "names no model" in e.value.message
    with pytest.raises(InvalidArgument) as e:
        SpeculativeConfig(speculative="ngram:x")  # only draft and eagle take a model
    assert e.value.field == "speculative"


# ---- whole runs against plain decoding ------------------------------------------------------


def _prompts(seed: int, n: int) -> list[list[int]]:
    """Prompts with repeats in them (so the n-gram drafter finds something)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        phrase = [rng.randrange(3, 200) for _ in range(rng.randrange(3, 8))]
        out.append([rng.randrange(3, 200) for _ in range(5)] + phrase * rng.randrange(2, 5))
    return out


def _run(
    worker: Worker, prompts: list[list[int]], specs: list[dict[str, Any]]
) -> list[RecordedRequest]:
    reqs = [
        make_request(worker, p, rid=f"q{i}", return_logprob=True, top_logprobs_num=2, **s)
        for i, (p, s) in enumerate(zip(prompts, specs, strict=True))
    ]
    for r in reqs:
        worker.scheduler.add_request(r)
    run_to_completion(worker)  # slots accounted after every step
    assert all_free_after_flush(worker)
    return reqs


def assert_same_greedy(spec: RecordedRequest, plain: RecordedRequest) -> None:
    """Same tokens (and logprobs to rounding), or a divergence at a near tie only."""
    a, b = spec.output_ids, plain.output_ids
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            top = plain.output_top_logprobs[i]
            assert top[0][0] - top[1][0] < NEAR_TIE, (spec.rid, i, top)
            return
        assert abs(spec.output_token_logprobs[i][0] - plain.output_token_logprobs[i][0]) < 1e-4
    assert len(a) == len(b) and spec.finish_reason == plain.finish_reason


def _compare(options: dict[str, Any], specs: list[dict[str, Any]], seed: int = 0) -> Worker:
    prompts = _prompts(seed, len(specs))
    plain = _run(make_worker(**options), prompts, specs)
    w = make_worker(speculative="ngram", **options)
    fast = _run(w, prompts, specs)
    for s, p in zip(fast, plain, strict=True):
        assert_same_greedy(s, p)
    return w


SPECS: list[dict[str, Any]] = [
    {"max_new_tokens": 40},
    {"max_new_tokens": 33, "speculative": False},
    {"max_new_tokens": 1},
    {"max_new_tokens": 17},
    {"max_new_tokens": 40, "ignore_eos": False, "stop_token_ids": [5, 17, 42]},
    {"max_new_tokens": 25, "min_new_tokens": 10, "ignore_eos": False, "stop_token_ids": [9]},
    {"max_new_tokens": 30, "presence_penalty": 0.5, "repetition_penalty": 1.2},
]


def test_same_outputs_as_plain_decoding() -> None:
    w = _compare({}, SPECS)
    stats = w.scheduler.speculator.stats  # type: ignore[union-attr]
    assert stats.verify_steps > 0 and stats.accepted_tokens > 0


def test_same_outputs_under_memory_pressure_and_overlap() -> None:
    # A pool too small for every request's drafts: steps fall back to the per-request
    # path (no drafts) and retract; the overlap scheduler turns synchronous for drafts.
    specs = [{"max_new_tokens": 48} for _ in range(8)]
    w = _compare({"kv_cache_tokens": 200, "overlap_schedule": True}, specs, seed=3)
    assert w.scheduler.stats().num_retractions > 0
    assert w.scheduler.speculator.stats.accepted_tokens > 0  # type: ignore[union-attr]


def test_abort_of_a_drafting_request() -> None:
    w = make_worker(speculative="ngram")
    assert w.scheduler.speculator is not None
    w.scheduler.speculator.drafter = _Fixed([7, 8, 9, 10])  # drafts every step, mostly wrong
    prompts = _prompts(5, 2)
    a = make_request(w, prompts[0], rid="a", max_new_tokens=60)
    b = make_request(w, prompts[1], rid="b", max_new_tokens=30)
    w.scheduler.add_request(a)
    w.scheduler.add_request(b)
    for _ in range(6):
        w.scheduler.step()
        assert_slots_accounted(w)
    assert a.spec_verify_steps > 0
    assert w.scheduler.abort("a")
    assert_slots_accounted(w)
    assert a.finish_reason is FinishReason.ABORT
    run_to_completion(w)
    assert b.finish_reason is FinishReason.LENGTH and b.num_output_tokens == 30
    assert all_free_after_flush(w)


def test_failed_step_frees_drafts() -> None:
    w = make_worker(speculative="ngram")
    r = make_request(w, _prompts(6, 1)[0], rid="a", max_new_tokens=60)
    w.scheduler.add_request(r)
    for _ in range(4):
        w.scheduler.step()
    w.scheduler.fail_all("boom")
    assert r.finish_reason is FinishReason.ABORT
    assert all_free_after_flush(w)


@pytest.mark.slow
def test_constrained_drafts_keep_every_slot_accounted(smollm2_gguf: object) -> None:
    """SmolLM2 with a JSON schema over a copy task: drafting rows whose tail jump-forward
    replaces (forced text after an accepted draft) trim their KV; every step balances."""
    import json

    from bench.sets.copy_heavy import TASKS
    from tests.worker.test_speculative_engine import PEOPLE_SCHEMA

    w = make_worker("smollm2", speculative="ngram", kv_cache_tokens=4096)
    ids = w.tokenizer.encode_chat([{"role": "user", "content": TASKS[9].prompt}])
    schema = json.dumps(PEOPLE_SCHEMA)
    reqs = [make_request(w, ids, max_new_tokens=m, json_schema=schema) for m in (90, 37)]
    for r in reqs:
        w.grammars.validate(r.params)
        w.scheduler.add_request(r)
        assert r.grammar is not None
        r.grammar.future.result(timeout=60)  # idle steps are fast: wait out the compile
    run_to_completion(w)
    assert all(r.spec_accepted_tokens > 0 for r in reqs)
    assert all(r.grammar is not None and r.grammar.num_forced_tokens > 0 for r in reqs)
    assert reqs[1].output_ids == reqs[0].output_ids[:37]
    assert all_free_after_flush(w)
