"""The draft-model drafter (dummy:tiny, float32, CPU): a draft model with the target's
own weights (both dummy:tiny with the same seed) proposes what the target decodes, so
nearly every draft is kept and the output is plain decoding's; every KV slot of both
workers accounted for; a draft model with another vocabulary is refused by name."""

from __future__ import annotations

import random

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.worker.config import SpeculativeConfig
from tests.worker.factories import (
    Recorder,
    all_free_after_flush,
    make_request,
    make_worker,
    run_to_completion,
)


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(3, 500) for _ in range(8 + 5 * i)] for i in range(n)]


def _drafted(overlap: bool, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Each prompt's output through a target drafting with dummy:tiny (its own weights),
    checked: nearly every draft kept, every slot of both workers back. Returns the
    outputs and how many tokens the draft worker computed."""
    w = make_worker(
        speculative="draft",
        speculative_draft_model="dummy:tiny",
        speculative_draft_kv_tokens=512,
        overlap_schedule=overlap,
    )
    assert w.draft is not None and w.draft.draft is None
    assert w.draft.config.scheduler.overlap_schedule is overlap  # it follows the target
    rec = Recorder().attach(w.draft)
    got = []
    for i, p in enumerate(prompts):
        r = make_request(w, p, rid=f"s{i}", max_new_tokens=20 + 3 * i)
        w.scheduler.add_request(r)
        got.append(r)
    run_to_completion(w)  # the target's slots balance after every step
    spec = w.scheduler.speculator
    assert spec is not None
    assert spec.stats.accepted_tokens >= 0.9 * spec.stats.drafted_tokens > 0
    assert all_free_after_flush(w)
    assert all_free_after_flush(w.draft)  # the draft model's requests all ended
    w.close()
    return [r.output_ids for r in got], rec.computed_tokens()


def test_a_draft_model_equal_to_the_target_drafts_its_tokens() -> None:
    """Plain decoding's output, with the draft worker's steps synchronous or overlapped
    (as the target's scheduler is): overlapped, it computes the same tokens, none past a
    draft's last."""
    prompts = _prompts(4)
    plain = make_worker()
    want = []
    for i, p in enumerate(prompts):
        r = make_request(plain, p, rid=f"p{i}", max_new_tokens=20 + 3 * i)
        plain.scheduler.add_request(r)
        want.append(r)
    run_to_completion(plain)
    sync, sync_rows = _drafted(False, prompts)
    over, over_rows = _drafted(True, prompts)
    assert sync == over == [r.output_ids for r in want]
    assert over_rows == sync_rows


def test_the_draft_model_named_in_the_method() -> None:
    """`speculative="draft:<model>"` (`--speculative draft:<model>`) loads that model."""
    w = make_worker(speculative="draft:dummy:tiny", speculative_draft_kv_tokens=512)
    assert w.config.speculative.speculative == "draft"
    assert w.draft is not None and w.draft.config.model.model == "dummy:tiny"
    w.close()


def test_refused_without_a_model_or_with_another_vocabulary() -> None:
    with pytest.raises(InvalidArgument) as e:
        SpeculativeConfig(speculative="draft")
    assert e.value.field == "speculative_draft_model"
    with pytest.raises(InvalidArgument) as e:
        make_worker(speculative="draft", speculative_draft_model="dummy:smollm2-135m")
    assert e.value.field == "speculative_draft_model"
    assert "49152" in e.value.message and "512" in e.value.message
