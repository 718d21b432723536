"""Speculative decoding on the GPU (skipped without CUDA): the bundled SmolLM2 in float32
with decode CUDA graphs and the overlap scheduler, drafting rows replaying the graphs
one row per token, against the same engine's plain decoding."""

from __future__ import annotations

import pytest
import torch

from bench.speculative_set import TASKS
from radixmesh.worker.engine import Engine
from tests.worker.conftest import assert_engine_idle_and_clean

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

NEAR_TIE = 1e-3  # logprob gap: the graph's batched GEMMs round differently from one row's


def test_graphs_and_overlap_equal_plain_greedy(smollm2_gguf: object) -> None:
    eng = Engine("smollm2", device="cuda", dtype="float32", speculative="ngram")
    try:
        assert eng.worker.runner.decode_graphs is not None
        prompts = [
            eng.tokenizer.encode_chat([{"role": "user", "content": t.prompt}]) for t in TASKS
        ]
        base = {
            "temperature": 0.0,
            "max_new_tokens": 64,
            "return_logprob": True,
            "top_logprobs_num": 2,
        }
        plain = eng.generate(input_ids=prompts, sampling_params={**base, "speculative": False})
        shaped = eng.worker.runner.num_decode_shaped_steps
        fast = eng.generate(input_ids=prompts, sampling_params=base)
        assert isinstance(plain, list) and isinstance(fast, list)
        assert eng.worker.runner.num_decode_shaped_steps > shaped  # verify rows replayed graphs
        s = eng.worker.scheduler.speculator
        assert s is not None and s.stats.accepted_tokens > 0
        for f, p in zip(fast, plain, strict=True):
            a, b = f["output_ids"], p["output_ids"]
            tops = p["meta_info"]["output_top_logprobs"]
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                if x != y:
                    assert tops[i][0][0] - tops[i][1][0] < NEAR_TIE, (i, tops[i])
                    break
            else:
                assert a == b
        assert_engine_idle_and_clean(eng)
    finally:
        eng.shutdown()
