"""Each running request's KV slots: where its tokens' KV goes, and where it goes after.

The scheduler decides who runs; this keeps the books of what they hold. A request's
slots come from the allocator (the radix cache evicting unlocked leaves when it is
short), are entered in its row of the req->token table, and at its end go to the cache
(`release`: finished or preempted, its computed tokens kept for reuse) or back to the
allocator (`discard`: after a failed step, whose KV writes may be partial). A prompt cut
into chunks shares each computed chunk through the tree at once (`share_prefix`).

Two figures per request besides the table: how many tokens have slots (`allocated`, at
least its computed tokens: a step's slots are taken before it runs) and, with pages, the
last slot of its own pages (a sequence mid-page takes the next slot of that page).
"""

from __future__ import annotations

from typing import cast

import torch

from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.kvcache.req_table import ReqToTokenTable
from radixmesh.worker.request import Request


class RequestSlots:
    def __init__(
        self,
        allocator: KVAllocator,
        cache: RadixCache,
        req_table: ReqToTokenTable,
        page_size: int,
    ) -> None:
        self.allocator = allocator
        self.cache = cache
        self.req_table = req_table
        self.page_size = page_size
        self._last_slot: dict[str, int] = {}  # rid -> last slot of its own pages
        self._allocated: dict[str, int] = {}  # rid -> tokens with slots (>= computed)
        # Slots `trim` took off requests, not yet given back (`free_trimmed`).
        self._trimmed: list[int] = []

    @property
    def num_trimmed(self) -> int:
        """Slots `trim` took off requests that `free_trimmed` has not given back yet."""
        return len(self._trimmed)

    def alloc(self, n: int, *, num_existing: int, last_slot: int | None) -> torch.Tensor | None:
        """Slots for n tokens, on the host (evicting if short): the caller reads the last
        one there and moves them to the device without a wait (on CUDA a blocking copy
        and `int(slots[-1])` would each wait for a step in flight under overlap)."""
        alloc = self.allocator.alloc
        new = alloc(n, last_slot=last_slot, num_existing=num_existing, on_host=True)
        if new is None and self.num_trimmed:
            self.free_trimmed()
            new = alloc(n, last_slot=last_slot, num_existing=num_existing, on_host=True)
        if new is None:
            self.cache.evict(n + self.page_size)
            new = alloc(n, last_slot=last_slot, num_existing=num_existing, on_host=True)
        return new

    def record(self, req: Request, row: int, start: int, host: torch.Tensor) -> torch.Tensor:
        """Enter new slots (allocated on the host) for tokens start.. of `req` in its table
        row and the bookkeeping; returns them (still on the host). The last slot matters
        only with pages (a sequence mid-page takes the next one): reading it costs a
        tensor index per admitted request, so page_size 1 skips it."""
        self.req_table.write(row, start, host)
        if self.page_size > 1 and len(host):
            self._last_slot[req.rid] = int(host[-1])
        self._allocated[req.rid] = start + len(host)
        return host

    def alloc_next(self, req: Request, n: int) -> torch.Tensor | None:
        """Slots for a running request's next n tokens, entered; None when memory is short
        even after eviction (the scheduler then retracts a request and tries again)."""
        host = self.alloc(
            n, num_existing=req.num_computed_tokens, last_slot=self._last_slot.get(req.rid)
        )
        if host is None:
            return None
        assert req.row is not None
        return self.record(req, req.row, req.num_computed_tokens, host)

    def alloc_decode(self, running: list[Request], counts: list[int]) -> torch.Tensor | None:
        """Slots for `counts[i]` next tokens of each running request in one allocator call
        and one table write (per-request calls cost ~10 us each, ~3 ms a step at batch
        256). Several tokens a row only with page_size 1. None, having taken nothing,
        when memory is short (no eviction here: the per-request path does it). One
        request (batch 1, a drafting row's 1 + k slots) writes its row's span as a slice;
        several, one indexed write."""
        by_page = self.page_size > 1
        existing = [r.num_computed_tokens for r in running]
        last = [self._last_slot.get(r.rid, 0) for r in running] if by_page else []
        new = self._alloc_rows(existing, last, counts)
        if new is None and self.num_trimmed:
            self.free_trimmed()
            new = self._alloc_rows(existing, last, counts)
        if new is None:
            return None
        rows = cast("list[int]", [r.row for r in running])  # running requests hold a row
        if len(running) == 1:
            self.req_table.write(rows[0], existing[0], new)
        elif len(new) == len(running):
            self.req_table.write_one_each(rows, existing, new)
        else:  # page_size 1, several tokens a row: any free slot will do for each token
            positions = [e + i for e, k in zip(existing, counts, strict=True) for i in range(k)]
            token_rows = [row for row, k in zip(rows, counts, strict=True) for _ in range(k)]
            self.req_table.write_one_each(token_rows, positions, new)
        if by_page:
            self._last_slot.update(zip((r.rid for r in running), new.tolist(), strict=True))
        self._allocated.update(
            (r.rid, n + k) for r, n, k in zip(running, existing, counts, strict=True)
        )
        return new

    def _alloc_rows(
        self, existing: list[int], last: list[int], counts: list[int]
    ) -> torch.Tensor | None:
        """The allocator's slots for alloc_decode: with pages one a row (the last page's
        next slot or a new page), else sum(counts) slots, any."""
        if self.page_size > 1:
            return self.allocator.alloc_next(existing, last)
        return self.allocator.alloc(sum(counts), on_host=True)

    def trim(self, req: Request, keep: int) -> None:
        """Take a running request's slots past its first `keep` tokens (speculative
        decoding's rejected drafts) off it. page_size 1: no page is shared by what stays
        and what goes. They go back to the allocator at `free_trimmed`, which the
        scheduler calls once the next step's forward is queued: a verify step's trim
        comes after the step's wait, on the host's path to the next step, and the
        allocator's bookkeeping (~0.1 ms on a GPU machine's host) runs while the device
        computes instead. An allocation that falls short frees them first. The few slots
        are kept as a list: a tensor view, its copy and a concatenation were three tensor
        calls on a step's host path for a handful of ints."""
        assert req.row is not None and self.page_size == 1
        end = self._allocated.get(req.rid, keep)
        if end > keep:
            self._trimmed += self.req_table.read_list(req.row, keep, end)
            self._allocated[req.rid] = keep

    def free_trimmed(self) -> None:
        """Give back every slot `trim` took off."""
        if not self._trimmed:
            return
        trimmed, self._trimmed = self._trimmed, []
        self.allocator.free(trimmed)

    def release(self, req: Request) -> None:
        """Give a request's KV to the cache (which frees what it does not keep)."""
        assert req.row is not None and req.last_node is not None
        n = req.num_computed_tokens
        # A view of the row, no copy: the cache copies what it keeps (and reads the rest)
        # before the row is freed below, and nothing writes the row meanwhile.
        slots = self.req_table.read(req.row, 0, n)
        # The whole token list as the key, not a copy of its first n: the cache reads
        # the tokens that have slots only.
        self.cache.cache_finished(req.token_ids, slots, req.last_node)
        self._forget(req)
        self._allocated.pop(req.rid, None)

    def discard(self, req: Request) -> None:
        """Free a request's own slots (those past its shared prefix), keep nothing."""
        assert req.row is not None and req.last_node is not None
        end = self._allocated.pop(req.rid, req.num_computed_tokens)
        own = self.req_table.read(req.row, req.num_shared_tokens, end)
        if own.numel():
            self.allocator.free(own.clone())
        self.cache.dec_lock_ref(req.last_node)
        self._forget(req)

    def share_prefix(self, req: Request) -> None:
        """After a prefill chunk, put the computed prefix in the tree so others reuse it."""
        assert req.row is not None and req.last_node is not None
        n = req.num_computed_tokens - req.num_computed_tokens % self.page_size
        if n == 0 or self.cache.disabled:
            return
        slots = self.req_table.read(req.row, 0, n)  # a view of the row
        shared, node = self.cache.cache_unfinished(req.token_ids, slots, req.last_node)
        if shared is not slots:  # some of its tokens were cached meanwhile: use the tree's
            self.req_table.write(req.row, 0, shared)
        # Else the row holds them already. Rewriting it cost a 1,600-slot copy per admitted
        # request on the shared-prefix workload, and on a GPU as many staged entries
        # (indices and slots) in the next step's host-to-device copy.
        req.last_node = node
        req.num_shared_tokens = n

    def _forget(self, req: Request) -> None:
        assert req.row is not None
        self.req_table.free_row(req.row)
        req.row = None
        req.last_node = None
        req.num_shared_tokens = 0
        self._last_slot.pop(req.rid, None)
