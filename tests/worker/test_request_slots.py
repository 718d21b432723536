"""worker/request_slots.py: rejected drafts' slots, taken off at the verify step and given
back at the next launch (or sooner, when an allocation would fall short)."""

from __future__ import annotations

from bench.speculative import NeverAccepted
from radixmesh.worker.worker import Worker
from tests.worker.factories import assert_slots_accounted, make_request, make_worker

K = 4


def _drafting_worker() -> Worker:
    """k drafts a step that are never kept (each verify step rejects all k)."""
    w = make_worker(speculative="ngram", speculative_tokens=K, speculative_min_accept_rate=0.0)
    spec = w.scheduler.speculator
    assert spec is not None
    spec.drafter = NeverAccepted(w.arch.vocab_size - 1)
    return w


def _verify_step(w: Worker) -> None:
    before = w.scheduler.speculator.stats.verify_steps  # type: ignore[union-attr]
    w.scheduler.step()
    assert w.scheduler.speculator.stats.verify_steps == before + 1  # type: ignore[union-attr]


def test_a_verify_steps_rejected_slots_go_back_at_the_next_launch() -> None:
    w = _drafting_worker()
    w.scheduler.add_request(make_request(w, list(range(3, 40)), max_new_tokens=20))
    w.scheduler.step()  # the prompt
    slots = w.scheduler.slots
    assert slots.num_trimmed == 0
    _verify_step(w)
    assert slots.num_trimmed == K  # the k rejected drafts, not yet free
    assert_slots_accounted(w)
    free = w.allocator.num_free_slots
    _verify_step(w)  # gives those back once its forward is queued, trims its own
    assert slots.num_trimmed == K
    # Back: the k trimmed; taken: this step's 1 + k, of which k are trimmed again.
    assert w.allocator.num_free_slots == free + K - (1 + K)
    assert_slots_accounted(w)


def test_trimmed_slots_are_freed_when_the_engine_goes_idle() -> None:
    w = _drafting_worker()
    w.scheduler.add_request(make_request(w, list(range(3, 40)), max_new_tokens=6))
    while w.scheduler.has_work():
        w.scheduler.step()
        assert_slots_accounted(w)
    assert w.scheduler.slots.num_trimmed == 0
    assert w.allocator.num_free_slots + w.cache.total_size() == w.allocator.num_usable_slots


def test_an_allocation_short_of_slots_takes_the_trimmed_ones_first() -> None:
    w = _drafting_worker()
    w.scheduler.add_request(make_request(w, list(range(3, 40)), max_new_tokens=20))
    w.scheduler.step()
    _verify_step(w)
    slots = w.scheduler.slots
    cached = w.cache.total_size()
    want = w.allocator.num_free_slots + slots.num_trimmed  # all of it, with nothing evicted
    got = slots.alloc(want, num_existing=0, last_slot=None)
    assert got is not None and len(got) == want
    assert slots.num_trimmed == 0 and w.allocator.num_free_slots == 0
    assert w.cache.total_size() == cached
    w.allocator.free(got)
