"""Constrained requests through the scheduler step by step: slots stay accounted after
every step, through jump-forward extends, retraction and the outlines backend."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixmesh.worker.request import FinishReason
from tests.worker.constrained.schemas import SCHEMAS
from tests.worker.factories import (
    all_free_after_flush,
    make_request,
    make_worker,
    run_to_completion,
)

pytestmark = pytest.mark.slow


def text_of(worker: object, req: object) -> str:
    return worker.tokenizer.decode(req.output_ids, skip_special_tokens=True)  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_memory_pressure_retracts_and_outputs_stay_valid(
    smollm2_gguf: object, backend: str
) -> None:
    # 64 slots for four distinct 15-token prompts with ~11-token outputs, admitted with no
    # reservation for their outputs: retraction must happen.
    worker = make_worker(
        "smollm2", kv_cache_tokens=64, new_token_ratio=0.0, grammar_backend=backend
    )
    schema = SCHEMAS["flat_person"]
    reqs = [
        make_request(
            worker,
            worker.tokenizer.encode(f"Person {i}: write a JSON record with a name and an age."),
            max_new_tokens=60,
            json_schema=json.dumps(schema),
        )
        for i in range(4)
    ]
    for r in reqs:
        worker.grammars.validate(r.params)
        worker.scheduler.add_request(r)
    run_to_completion(worker)  # asserts the slot accounting after every step
    assert worker.scheduler.stats().num_retractions > 0
    for r in reqs:
        assert r.finish_reason is FinishReason.STOP
        jsonschema.validate(json.loads(text_of(worker, r)), schema)
        assert r.grammar is not None and r.grammar.num_forced_tokens > 0
    assert all_free_after_flush(worker)


def test_outlines_regex_and_choices(smollm2_gguf: object) -> None:
    worker = make_worker("smollm2", grammar_backend="outlines")
    prompt = worker.tokenizer.encode("Order number:")
    a = make_request(worker, prompt, max_new_tokens=20, regex=r"ORD-[0-9]{4}-[A-Z]{2}")
    b = make_request(worker, prompt, max_new_tokens=20, choices=["shipped", "pending"])
    for r in (a, b):
        worker.grammars.validate(r.params)
        worker.scheduler.add_request(r)
    run_to_completion(worker)
    assert re.fullmatch(r"ORD-[0-9]{4}-[A-Z]{2}", text_of(worker, a))
    assert text_of(worker, b) in ("shipped", "pending")
    assert a.grammar is not None and a.grammar.num_forced_tokens > 0  # "ORD-" is forced
    assert all_free_after_flush(worker)


def test_admission_waits_for_the_compile(smollm2_gguf: object) -> None:
    """A request whose grammar still compiles is skipped; others run meanwhile."""
    worker = make_worker("smollm2")
    gate = worker.grammars.cache  # build the backend, then hold its compile's result
    import threading

    release = threading.Event()
    load = gate.backend.load

    def held(data: str | bytes) -> object:
        release.wait(30)
        return load(data)

    gate.backend.load = held  # type: ignore[method-assign]
    prompt = worker.tokenizer.encode("Number:")
    slow = make_request(worker, prompt, max_new_tokens=8, regex="[0-9]{3}")
    free = make_request(worker, prompt, max_new_tokens=3)
    worker.scheduler.add_request(slow)
    worker.scheduler.add_request(free)
    for _ in range(4):
        worker.scheduler.step()
    assert free.finished and not slow.admitted
    release.set()
    assert slow.grammar is not None
    slow.grammar.future.result(timeout=60)  # idle steps are fast: wait out the compile here
    run_to_completion(worker)
    assert re.fullmatch("[0-9]{3}", text_of(worker, slow))


def test_dummy_model_with_byte_tokenizer() -> None:
    """Random weights, bytes as tokens: the grammar alone makes the output match."""
    worker = make_worker()  # dummy:tiny
    prompt = worker.tokenizer.encode("id: ")
    reqs = [
        make_request(worker, prompt, max_new_tokens=40, regex=r"user-[0-9]{4}-(ok|fail)"),
        make_request(worker, prompt, max_new_tokens=40, temperature=1.0, regex=r"[a-c]{3}x{3}"),
    ]
    for r in reqs:
        worker.grammars.validate(r.params)
        worker.scheduler.add_request(r)
    run_to_completion(worker)
    assert re.fullmatch(r"user-[0-9]{4}-(ok|fail)", text_of(worker, reqs[0]))
    assert re.fullmatch(r"[a-c]{3}x{3}", text_of(worker, reqs[1]))
    assert reqs[0].grammar is not None and reqs[0].grammar.num_forced_tokens >= len("user-")
    assert all_free_after_flush(worker)
