"""The EAGLE drafter in the worker (dummy:tiny target, a random head of its shape written
to disk, float32, CPU): greedy output is plain decoding's whatever the head proposes,
with plain and drafting requests mixed and an abort, every KV slot accounted for after
every step; the features the drafter receives are the target's final hidden states of a
plain forward of the same tokens; nothing is copied when speculation is not eagle, nor
in a step too large to draft or with no request that may draft."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from radixmesh.worker.batch import Batch, ForwardOutput
from radixmesh.worker.request import FinishReason, Request
from radixmesh.worker.speculative.eagle import EagleDrafter
from radixmesh.worker.worker import Worker
from tests.worker.factories import (
    all_free_after_flush,
    assert_slots_accounted,
    make_request,
    make_worker,
    run_to_completion,
)
from tests.worker.speculative.eagle_checkpoint import write_head


def _prompts(n: int, seed: int = 11) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(8 + 5 * i)] for i in range(n)]


def _eagle(tmp_path: Path, **options: Any) -> Worker:
    head = write_head(tmp_path / "head", seed=3)
    return make_worker(speculative="eagle", speculative_draft_model=str(head), **options)


def _drafter(w: Worker) -> EagleDrafter:
    spec = w.scheduler.speculator
    assert spec is not None and isinstance(spec.drafter, EagleDrafter)
    return spec.drafter


def _plain_outputs(prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    w = make_worker()
    reqs = [make_request(w, p, max_new_tokens=n) for p, n in zip(prompts, lengths, strict=True)]
    for r in reqs:
        w.scheduler.add_request(r)
    run_to_completion(w)
    w.close()
    return [r.output_ids for r in reqs]


def test_greedy_output_is_plain_decodings(tmp_path: Path) -> None:
    prompts = _prompts(5)
    lengths = [24 + 4 * i for i in range(5)]
    want = _plain_outputs(prompts, lengths)
    # min_accept_rate 0: a random head's drafts are mostly rejected; keep drafting anyway.
    w = _eagle(tmp_path, speculative_min_accept_rate=0.0)
    reqs = []
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        r = make_request(w, p, rid=f"e{i}", max_new_tokens=n, speculative=i % 3 != 1)
        w.scheduler.add_request(r)
        reqs.append(r)
    run_to_completion(w)  # slots balance after every step
    assert [r.output_ids for r in reqs] == want
    spec = w.scheduler.speculator
    assert spec is not None and spec.stats.verify_steps > 0 and spec.stats.drafted_tokens > 0
    assert reqs[1].spec_verify_steps == 0 and reqs[0].spec_verify_steps > 0
    drafter = _drafter(w)
    assert drafter.propose_all([]) == {} and len(drafter._states) == 0  # finished: freed
    # A radix-cache hit on the whole prompt: its positions have no features, the head
    # drafts from what follows; the output is the same.
    again = make_request(w, prompts[0], rid="again", max_new_tokens=lengths[0])
    w.scheduler.add_request(again)
    run_to_completion(w)
    assert again.output_ids == want[0] and again.spec_verify_steps > 0
    assert all_free_after_flush(w)
    w.close()


def test_abort_of_a_drafting_request(tmp_path: Path) -> None:
    prompts = _prompts(3, seed=5)
    w = _eagle(tmp_path, speculative_min_accept_rate=0.0)
    a = make_request(w, prompts[0], rid="a", max_new_tokens=60)
    b = make_request(w, prompts[1], rid="b", max_new_tokens=30)
    for r in (a, b):
        w.scheduler.add_request(r)
    for _ in range(6):
        w.scheduler.step()
        assert_slots_accounted(w)
    assert a.spec_verify_steps > 0 and a in _drafter(w)._states
    assert w.scheduler.abort("a")
    assert_slots_accounted(w)
    assert a.finish_reason is FinishReason.ABORT
    run_to_completion(w)
    assert b.finish_reason is FinishReason.LENGTH
    assert b.output_ids == _plain_outputs([prompts[1]], [30])[0]
    assert a not in _drafter(w)._states
    assert all_free_after_flush(w)
    w.close()


def _target_hidden(w: Worker, ids: list[int]) -> torch.Tensor:
    """The target's final hidden states of `ids`, one plain prefill (no speculation)."""
    got: list[torch.Tensor] = []
    inner = w.runner.forward

    def forward(batch: Batch) -> ForwardOutput:
        out = inner(batch)
        got.extend(f for f in out.features if f is not None)
        return out

    w.runner.keep_features = True
    w.scheduler.runner = type("R", (), {"forward": staticmethod(forward)})()
    r = make_request(w, ids, max_new_tokens=1)
    w.scheduler.add_request(r)
    run_to_completion(w)
    return torch.cat(got)


def test_features_are_the_targets_hidden_states(tmp_path: Path) -> None:
    w = _eagle(tmp_path, speculative_min_accept_rate=0.0, max_num_batched_tokens=16)
    drafter = _drafter(w)
    seen: dict[int, torch.Tensor] = {}  # position -> the last feature received for it
    observe = drafter.observe

    def record(req: Request, start: int, features: torch.Tensor) -> None:
        for j, row in enumerate(features):
            seen[start + j] = row.clone()
        observe(req, start, features)

    drafter.observe = record  # type: ignore[method-assign]
    prompt = _prompts(1, seed=9)[0] + _prompts(1, seed=10)[0] * 3  # 32 tokens: two chunks
    r = make_request(w, prompt, max_new_tokens=40)
    w.scheduler.add_request(r)
    run_to_completion(w)
    assert r.spec_verify_steps > 0
    sequence = r.token_ids
    assert sorted(seen) == list(range(len(sequence) - 1))  # every computed position
    want = _target_hidden(make_worker(), sequence[:-1])
    got = torch.stack([seen[p] for p in range(len(sequence) - 1)])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    w.close()


@pytest.mark.parametrize("speculative", ["off", "ngram"])
def test_no_features_without_eagle(speculative: str) -> None:
    w = make_worker(speculative=speculative)
    assert not w.runner.keep_features
    outs: list[ForwardOutput] = []
    inner = w.runner.forward

    def forward(batch: Batch) -> ForwardOutput:
        outs.append(inner(batch))
        return outs[-1]

    w.scheduler.runner = type("R", (), {"forward": staticmethod(forward)})()
    w.scheduler.add_request(make_request(w, _prompts(1)[0], max_new_tokens=4))
    run_to_completion(w)
    assert outs and all(o.features == [] for o in outs)
    w.close()


@torch.inference_mode()
def test_drafts_equal_the_head_over_the_whole_history(tmp_path: Path) -> None:
    """The drafter's k tokens (features fed in two chunks, then k - 1 cached steps) equal
    the head run over the whole history at once for each draft position."""
    w = _eagle(tmp_path)
    drafter = _drafter(w)
    ids = _prompts(1, seed=4)[0] + _prompts(1, seed=6)[0]  # 16 tokens
    feats = _target_hidden(make_worker(), ids[:-1])  # [15, H]
    req = make_request(w, ids)
    req.num_computed_tokens = len(ids) - 1
    drafter.observe(req, 0, feats[:6])
    drafter.observe(req, 6, feats[6:])
    got = drafter.propose(req, 4)
    head, target = drafter.head, drafter.target
    tokens, features, want = list(ids[1:]), feats, []
    kv = feats.new_empty(0, 2, 16)
    for _ in range(4):
        embeds = target.model.embed_tokens(torch.tensor(tokens))
        h, _, _ = head(embeds, features, torch.arange(len(tokens)), kv, kv)
        want.append(int(target.compute_logits(h[-1:]).argmax()))
        tokens.append(want[-1])
        features = torch.cat((features, h[-1:]))
    assert got == want
    w.close()


@torch.inference_mode()
def test_a_batch_drafts_what_each_request_drafts_alone(tmp_path: Path) -> None:
    """Four requests drafting together (histories of different lengths, one feed longer
    than BATCHED_FEED, k of 4, 2, 3 and 1), twice, the second time after each kept more
    positions: the same tokens as each request drafting alone in a drafter of its own,
    and the same outputs up to float32 rounding. Every drafted position's two best
    logits are further apart than that rounding, so no tie decides a token."""
    from radixmesh.worker.speculative.eagle import BATCHED_FEED

    w = _eagle(tmp_path)
    head, target = _drafter(w).head, _drafter(w).target
    plain = make_worker()
    ids = [p + q for p, q in zip(_prompts(4, seed=8), _prompts(4, seed=9), strict=True)]
    ids[3] = ids[3] + _prompts(6, seed=10)[5]  # 90 tokens: a feed past BATCHED_FEED
    assert len(ids[3]) - 1 > BATCHED_FEED
    ks = [4, 2, 3, 1]
    together = EagleDrafter(head, target)
    alone = [EagleDrafter(head, target) for _ in ids]
    logits: list[torch.Tensor] = []
    compute = target.compute_logits

    def recorded(h: torch.Tensor) -> torch.Tensor:
        out = compute(h)
        logits.append(out)
        return out

    target.compute_logits = recorded  # type: ignore[method-assign,assignment]
    reqs = [make_request(w, x) for x in ids]
    done = [0] * len(ids)  # positions observed
    for extra in (0, 5):
        for i, req in enumerate(reqs):
            req.token_ids.extend(range(7, 7 + extra))
            req.num_computed_tokens = len(req.token_ids) - 1
            assert plain.flush_cache()  # every position computed, none from the cache
            feats = _target_hidden(plain, req.token_ids[:-1])
            for d in (together, alone[i]):
                d.observe(req, done[i], feats[done[i] :])
            done[i] = len(feats)
        got = together.propose_all(list(zip(reqs, ks, strict=True)))
        want = {req: d.propose(req, k) for req, d, k in zip(reqs, alone, ks, strict=True)}
        assert got == want and [len(got[r]) for r in reqs] == ks
    top2 = torch.cat(logits).topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-4
    plain.close()
    w.close()


def _feed(drafter: EagleDrafter, state: Any, ids: list[int], limit: int) -> None:
    """The state's pending positions < limit through the head, as a draft feeds them."""
    req: Any = SimpleNamespace(token_ids=ids, num_computed_tokens=limit)
    pending = drafter._pending(req, state)
    if pending is not None:
        drafter._feed([(state, pending)])


def test_what_the_drafter_keeps_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from radixmesh.worker.speculative import eagle

    monkeypatch.setattr(eagle, "MAX_PENDING", 6)
    monkeypatch.setattr(eagle, "MAX_HISTORY", 10)
    w = _eagle(tmp_path)
    drafter = _drafter(w)
    hidden = w.arch.hidden_size
    req = make_request(w, list(range(3, 40)), max_new_tokens=4)
    drafter.observe(req, 0, torch.zeros(9, hidden))  # a chunk longer than MAX_PENDING
    state = drafter._states[req]
    assert [(first, len(rows)) for first, rows in state.pending] == [(3, 6)]
    drafter.observe(req, 9, torch.zeros(4, hidden))  # the oldest chunk goes
    assert [(first, len(rows)) for first, rows in state.pending] == [(9, 4)]
    drafter.observe(req, 13, torch.zeros(24, hidden))
    req.num_computed_tokens = 37
    _feed(drafter, state, req.token_ids, 36)  # positions 31..35 through the head
    assert state.positions == list(range(31, 36)) and state.keys.shape[0] == 5
    drafter.observe(req, 36, torch.zeros(1, hidden))
    for p in range(37, 45):  # one position at a time: the window slides
        _feed(drafter, state, [*req.token_ids, *range(3, 12)], p)
        drafter.observe(req, p, torch.zeros(1, hidden))
    assert state.positions == list(range(34, 44)) and state.keys.shape[0] == 10
    w.close()


def test_a_batch_too_large_to_draft_keeps_nothing(tmp_path: Path) -> None:
    w = _eagle(tmp_path, speculative_max_batch_size=2)
    spec = w.scheduler.speculator
    assert spec is not None
    drafter = _drafter(w)
    reqs: list[Request] = [make_request(w, p, max_new_tokens=8) for p in _prompts(3)]
    hidden = torch.zeros(len(reqs[0].token_ids), w.arch.hidden_size)
    assert spec.drafts(reqs[:2]) == {}  # two running: may draft, features kept
    spec.observe(reqs[0], 0, hidden)
    assert reqs[0] in drafter._states
    spec.drafts(reqs)  # three running: above the limit
    spec.observe(reqs[0], 0, hidden)
    spec.observe(reqs[1], 0, hidden)
    assert len(drafter._states) == 0
    w.close()


def _count_feature_copies(
    w: Worker, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[int, int]], list[ForwardOutput]]:
    """Wraps the runner: per step, (requests running when it was scheduled, feature copies
    the runner made in it), and its outputs."""
    from radixmesh.worker import model_runner

    copies = [0]
    inner_features = model_runner._features

    def features(items: Any, hidden: torch.Tensor) -> list[torch.Tensor | None]:
        copies[0] += 1
        return inner_features(items, hidden)

    monkeypatch.setattr(model_runner, "_features", features)
    steps: list[tuple[int, int]] = []
    outs: list[ForwardOutput] = []
    inner = w.runner.forward
    running = [0]

    def forward(batch: Batch) -> ForwardOutput:
        before = copies[0]
        outs.append(inner(batch))
        steps.append((running[0], copies[0] - before))
        return outs[-1]

    w.scheduler.runner = type("R", (), {"forward": staticmethod(forward)})()
    schedule = w.scheduler.schedule

    def counted() -> Batch | None:
        running[0] = len(w.scheduler.running)  # what the speculator's decision reads
        return schedule()

    w.scheduler.schedule = counted  # type: ignore[method-assign]
    return steps, outs


def test_a_step_too_large_to_draft_copies_no_features(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _prompts(3, seed=7)
    lengths = [4, 6, 20]
    want = _plain_outputs(prompts, lengths)
    w = _eagle(
        tmp_path,
        speculative_max_batch_size=2,
        speculative_min_accept_rate=0.0,
        overlap_schedule=False,
    )
    drafter = _drafter(w)
    steps, outs = _count_feature_copies(w, monkeypatch)
    reqs = [
        make_request(w, p, rid=f"b{i}", max_new_tokens=n)
        for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    for r in reqs:
        w.scheduler.add_request(r)
    held: list[int] = []  # requests the drafter holds state for, after each step
    while w.scheduler.has_work():
        w.scheduler.step()
        assert_slots_accounted(w)
        held.append(len(drafter._states))
    # The prompts' step (none running yet) copies; the three decoding together (above
    # the limit of 2) copy nothing and the drafter holds nothing; once the first has
    # finished the two left copy again, and draft.
    running = [n for n, _ in steps]
    assert running[:5] == [0, 3, 3, 3, 2]
    assert [c for _, c in steps] == [1 if n <= 2 else 0 for n in running]
    assert [o.features == [] for o in outs] == [n > 2 for n in running]
    assert held[:4] == [3, 0, 0, 0] and held[4] == 2
    assert sum(f is not None for f in outs[0].features) == 3  # the three prompts' rows
    assert [r.output_ids for r in reqs] == want
    assert reqs[2].spec_verify_steps > 0
    w.close()


def test_a_step_with_no_request_that_may_draft_copies_no_features(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = _eagle(tmp_path, overlap_schedule=False)
    steps, outs = _count_feature_copies(w, monkeypatch)
    for i, p in enumerate(_prompts(2, seed=8)):
        w.scheduler.add_request(
            make_request(w, p, rid=f"n{i}", max_new_tokens=5, speculative=False)
        )
    run_to_completion(w)
    assert len(steps) == 5 and [c for _, c in steps] == [0, 0, 0, 0, 0]
    assert all(o.features == [] for o in outs)
    w.close()
