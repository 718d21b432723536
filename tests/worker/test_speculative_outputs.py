"""A speculating engine's outputs: its per-request draft counters in SGLang's meta_info,
and the per-request opt-out (`SamplingParams.speculative`), on the bundled SmolLM2."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixmesh.worker.engine import Engine

pytestmark = pytest.mark.slow

SENTENCE = "The quick brown fox jumps over the lazy dog, and the dog sleeps in the sun."
GREEDY = {"temperature": 0.0, "max_new_tokens": 40}


@pytest.fixture(scope="module")
def speculating(smollm2_gguf: Path) -> Iterator[Engine]:
    eng = Engine("smollm2", dtype="float32", speculative="ngram", kv_cache_tokens=4096)
    yield eng
    eng.shutdown()


def _repeat(engine: Engine, **params: Any) -> dict[str, Any]:
    ids = engine.tokenizer.encode_chat(
        [{"role": "user", "content": f"Repeat this sentence exactly: {SENTENCE}"}]
    )
    out = engine.generate(input_ids=ids, sampling_params={**GREEDY, **params})
    assert isinstance(out, dict)
    return out


def test_a_request_that_copies_its_prompt_reports_its_verified_drafts(
    speculating: Engine,
) -> None:
    meta = _repeat(speculating)["meta_info"]
    steps, drafted, accepted = (
        meta["spec_verify_ct"],
        meta["spec_draft_tokens"],
        meta["spec_accepted_tokens"],
    )
    assert steps > 0
    assert steps <= drafted <= 4 * steps  # 1..speculative_tokens drafts per verify step
    assert 0 < accepted <= drafted


def test_a_request_that_opts_out_drafts_nothing_and_gets_the_same_tokens(
    speculating: Engine,
) -> None:
    drafting = _repeat(speculating)
    out = _repeat(speculating, speculative=False)
    assert {k for k in out["meta_info"] if k.startswith("spec_")} == set()
    assert out["output_ids"] == drafting["output_ids"]
    assert out["text"] == drafting["text"]
