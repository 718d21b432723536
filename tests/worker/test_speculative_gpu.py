"""Speculative decoding on the GPU (skipped without CUDA): decode CUDA graphs and the
overlap scheduler, drafting rows replaying the graphs one row per token, against the same
engine's plain decoding, and a draft model's worker replaying graphs of its own.
dummy:smollm2-135m (SmolLM2's shapes, random weights: the bundled
model's file does not travel to the GPU machine) in float32, drafting what plain decoding
produced (so drafts are kept) with every third draft spoiled (so some are rejected)."""

from __future__ import annotations

import random

import pytest
import torch

from radixmesh.worker.engine import Engine
from radixmesh.worker.request import Request
from tests.worker.conftest import assert_engine_idle_and_clean

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

NEAR_TIE = 1e-3  # logprob gap: the graph's batched GEMMs round differently from one row's


class _Oracle:
    """Proposes the plain run's next tokens for a prompt it knows, every third draft
    spoiled."""

    def __init__(self, outputs: dict[tuple[int, ...], list[int]]) -> None:
        self.outputs = outputs
        self.calls = 0

    def propose(self, req: Request, k: int) -> list[int]:
        self.calls += 1
        out = self.outputs.get(tuple(req.prompt_ids), [])
        done = req.num_output_tokens
        draft = list(out[done : done + k])
        if draft and self.calls % 3 == 0:
            draft[-1] = (draft[-1] + 1) % 1000
        return draft


def test_graphs_and_overlap_equal_plain_greedy() -> None:
    eng = Engine("dummy:smollm2-135m", device="cuda", dtype="float32", speculative="ngram")
    try:
        assert eng.worker.runner.decode_graphs is not None
        rng = random.Random(0)
        prompts = [[rng.randrange(10, 40000) for _ in range(40 + 13 * i)] for i in range(6)]
        base = {
            "temperature": 0.0,
            "max_new_tokens": 48,
            "ignore_eos": True,
            "return_logprob": True,
            "top_logprobs_num": 2,
        }
        plain = eng.generate(input_ids=prompts, sampling_params={**base, "speculative": False})
        assert isinstance(plain, list)
        spec = eng.worker.scheduler.speculator
        assert spec is not None
        spec.drafter = _Oracle(
            {tuple(p): r["output_ids"] for p, r in zip(prompts, plain, strict=True)}
        )
        shaped = eng.worker.runner.num_decode_shaped_steps
        fast = eng.generate(input_ids=prompts, sampling_params=base)
        assert isinstance(fast, list)
        assert eng.worker.runner.num_decode_shaped_steps > shaped  # verify rows replayed graphs
        assert spec.stats.accepted_tokens > 0
        assert spec.stats.accepted_tokens < spec.stats.drafted_tokens  # some were spoiled
        _assert_same_but_near_ties(fast, plain)
        assert_engine_idle_and_clean(eng)
    finally:
        eng.shutdown()


def test_a_draft_model_replays_its_own_graphs_and_equals_plain_greedy() -> None:
    """The draft worker (the target's own dummy weights: it proposes what the target
    decodes) captures decode graphs; its steps after a request's first replay them."""
    eng = Engine(
        "dummy:smollm2-135m",
        device="cuda",
        dtype="float32",
        speculative="draft",
        speculative_draft_model="dummy:smollm2-135m",
    )
    try:
        draft = eng.worker.draft
        assert draft is not None and draft.runner.decode_graphs is not None
        rng = random.Random(1)
        prompts = [[rng.randrange(10, 40000) for _ in range(40 + 13 * i)] for i in range(4)]
        base = {
            "temperature": 0.0,
            "max_new_tokens": 40,
            "ignore_eos": True,
            "return_logprob": True,
            "top_logprobs_num": 2,
        }
        plain = eng.generate(input_ids=prompts, sampling_params={**base, "speculative": False})
        assert isinstance(plain, list)
        shaped = draft.runner.num_decode_shaped_steps
        fast = eng.generate(input_ids=prompts, sampling_params=base)
        assert isinstance(fast, list)
        assert draft.runner.num_decode_shaped_steps > shaped
        spec = eng.worker.scheduler.speculator
        assert spec is not None and spec.stats.accepted_tokens > 0
        _assert_same_but_near_ties(fast, plain)
        assert_engine_idle_and_clean(eng)
    finally:
        eng.shutdown()


def _assert_same_but_near_ties(fast: list[dict], plain: list[dict]) -> None:
    """Each output equals plain decoding's up to its first difference, which must be a
    near tie of plain decoding's two best tokens."""
    for f, p in zip(fast, plain, strict=True):
        a, b = f["output_ids"], p["output_ids"]
        tops = p["meta_info"]["output_top_logprobs"]
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                assert tops[i][0][0] - tops[i][1][0] < NEAR_TIE, (i, tops[i])
                break
        else:
            assert a == b
