"""worker/request_slots.py: rejected drafts' slots, taken off at the verify step and given
back at the next launch (or sooner, when an allocation would fall short); a computed
prompt shared through the tree."""

from __future__ import annotations

import torch

from bench.speculative import NeverAccepted
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.kvcache.req_table import ReqToTokenTable
from radixmesh.worker.request import Request
from radixmesh.worker.request_slots import RequestSlots
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


def _sharing(prompt: list[int]) -> tuple[RequestSlots, Request]:
    """A request admitted with nothing cached, its whole prompt computed, on a mirrored
    req->token table (the GPU's write path) whose staged writes the step took."""
    alloc = KVAllocator(64)
    cache = RadixCache(alloc, 1)
    table = ReqToTokenTable(4, 32, mirrored=True)
    slots = RequestSlots(alloc, cache, table, 1)
    req = Request(rid="r", prompt_ids=prompt, params=SamplingParams(max_new_tokens=2))
    match = cache.match_prefix(prompt)
    cache.inc_lock_ref(match.last_node)
    row = table.alloc_row()
    assert row is not None
    req.row, req.last_node = row, match.last_node
    new = slots.alloc(len(prompt), num_existing=0, last_slot=None)
    assert new is not None
    slots.record(req, row, 0, new)
    req.num_computed_tokens = len(prompt)
    table.take_staged()  # the step's forward took them
    return slots, req


def test_sharing_a_computed_prompt_rewrites_no_table_entry_the_tree_took_as_is() -> None:
    slots, req = _sharing([5, 6, 7, 8])
    assert req.row is not None
    before = slots.req_table.read_list(req.row, 0, 4)
    slots.share_prefix(req)
    assert slots.req_table.num_staged_writes == 0  # nothing for the device to copy
    assert slots.req_table.read_list(req.row, 0, 4) == before
    assert req.num_shared_tokens == 4 and req.last_node is not None
    assert req.last_node.end == 4 and req.last_node.lock_ref == 1


def test_sharing_a_prompt_cached_meanwhile_takes_the_trees_slots() -> None:
    slots, req = _sharing([5, 6, 7, 8])
    assert req.row is not None
    own = slots.req_table.read_list(req.row, 0, 4)
    tree = slots.allocator.alloc(3)  # an equal prompt's first three tokens, shared first
    assert tree is not None
    slots.cache.insert([5, 6, 7], tree)
    slots.share_prefix(req)
    assert slots.req_table.read_list(req.row, 0, 4) == [*tree.tolist(), own[3]]
    assert slots.req_table.num_staged_writes == 4  # the row again, for the device
    assert slots.allocator.free_slot_mask(torch.tensor(own[:3])).tolist() == [True] * 3
