"""KVAllocator: hands out KV-pool slots a page at a time.

The pool's `num_slots` slots are cut into pages of `page_size` consecutive slots
(page p = slots [p*page_size, (p+1)*page_size)). Page 0 holds the reserved padding slot 0
and is never handed out, so `num_slots // page_size - 1` pages are usable. Slots outside
them are never used: the rest of page 0 (page_size - 1 slots) and, when `num_slots` is
not a multiple of `page_size`, the trailing partial page.

Ownership: a page is either free (here) or owned by exactly one holder (a running request
or the radix cache). Holders free what they own with `free`; freeing a free page raises,
which is how tests catch double frees. A sequence owns whole pages, so the unused tail of
its last page stays reserved for it: `alloc(..., last_slot=, num_existing=)` fills that
tail before taking new pages.

Free pages sit in a stack (a numpy array with a top index) plus a free bitmap, so alloc
and free cost O(pages touched), with no sorting. Freed pages are reused LIFO: the pages of
the latest `free` are handed out first, in the order they were passed (their memory is
likely still warm in cache). Not thread-safe: the scheduler thread is the only caller.
"""

from __future__ import annotations

import numpy as np
import torch

from radixmesh.worker.forward_batch import to_device

# `free` of at most this many slots given as a list runs in Python (see `_free_few`).
_FEW = 64


class KVAllocator:
    def __init__(self, num_slots: int, page_size: int = 1, device: torch.device | str = "cpu"):
        if page_size < 1:
            raise ValueError(f"page_size: must be >= 1, got {page_size}")
        num_pages = num_slots // page_size
        if num_pages < 2:
            raise ValueError(
                f"num_slots: {num_slots} slots give {num_pages} page(s) of {page_size}; "
                "need at least 2 (page 0 is reserved)"
            )
        self.num_slots = num_slots
        self.page_size = page_size
        self.device = torch.device(device)
        self.num_pages = num_pages
        # The top of the stack is the end of `_stack[:_top]`; initial hand-out order 1, 2, 3...
        self._stack = np.arange(num_pages - 1, 0, -1, dtype=np.int64)
        self._top = num_pages - 1
        self._is_free = np.ones(num_pages, dtype=np.bool_)
        self._is_free[0] = False
        self._page_offsets = np.arange(page_size, dtype=np.int64)
        self._scratch = np.zeros(num_pages, dtype=np.int64)  # see _distinct

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def num_usable_pages(self) -> int:
        return self.num_pages - 1

    @property
    def num_usable_slots(self) -> int:
        return self.num_usable_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self._top

    @property
    def num_free_slots(self) -> int:
        return self._top * self.page_size

    def pages_needed(self, num_tokens: int, num_existing: int = 0) -> int:
        """New pages `alloc(num_tokens, num_existing=num_existing)` would take."""
        ps = self.page_size
        return -(-(num_existing + num_tokens) // ps) - -(-num_existing // ps)

    # ---- alloc / free --------------------------------------------------------------------
    def alloc(
        self,
        num_tokens: int,
        *,
        last_slot: int | None = None,
        num_existing: int = 0,
        on_host: bool = False,
    ) -> torch.Tensor | None:
        """Slots [num_tokens] int64 (on `device`, or the CPU with `on_host`) for the next
        tokens of a sequence.

        The sequence already has `num_existing` tokens, the last in `last_slot`; when its
        last page is partly used, the new tokens first take slots last_slot+1, ... of that
        page, then whole new pages. Returns None, allocating nothing, when there are not
        enough free pages.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens: must be >= 0, got {num_tokens}")
        if self.page_size == 1:  # no page is partly used: no tail to fill first
            new = self._take(num_tokens)
            if new is None:
                return None
        else:
            head = self._page_tail(num_tokens, last_slot, num_existing)
            rest = num_tokens - len(head)
            pages = self._take(-(-rest // self.page_size))
            if pages is None:
                return None
            new = (pages[:, None] * self.page_size + self._page_offsets).reshape(-1)[:rest]
            if len(head):
                new = np.concatenate([head, new])
        out = torch.from_numpy(new)  # `new` is always a fresh array: safe to share
        return out if on_host or self.device.type == "cpu" else to_device(out, self.device)

    def alloc_next(self, num_existing: list[int], last_slots: list[int]) -> torch.Tensor | None:
        """One slot each for the next token of many sequences (a decode step), in one call.

        Same slots, in the same order, as `alloc(1, last_slot=, num_existing=)` per
        sequence: a sequence whose last page has room takes `last_slot + 1`, one at a page
        boundary takes the next free page (its `last_slots` entry is then ignored). Returns
        None, allocating nothing, when there are not enough free pages for all of them.
        Per-sequence alloc costs ~10 us of Python each, which a batch of 256 pays every step.
        The slots stay on the CPU (unlike `alloc`'s): the caller reads them for its own
        bookkeeping and moves them to the device once, not once per sequence.
        """
        ps = self.page_size
        if ps == 1:
            pages = self._take(len(num_existing))
            return None if pages is None else torch.from_numpy(pages)
        existing = np.asarray(num_existing, dtype=np.int64)  # [B]
        at_boundary = existing % ps == 0  # [B] needs a new page
        pages = self._take(int(at_boundary.sum()))
        if pages is None:
            return None
        new = np.asarray(last_slots, dtype=np.int64) + 1
        new[at_boundary] = pages * ps
        return torch.from_numpy(new)  # `new` is always a fresh array: safe to share

    def _take(self, n_pages: int) -> np.ndarray | None:
        """n pages off the stack (a fresh array), marked taken; None, taking nothing,
        when fewer are free."""
        if n_pages > self._top:
            return None
        # Reversed: the top of the stack is the slice's end, and it goes first.
        pages = self._stack[self._top - n_pages : self._top][::-1].copy()
        self._top -= n_pages
        self._is_free[pages] = False
        return pages

    def free(self, slots: torch.Tensor | list[int]) -> None:
        """Return the distinct pages `slots` (a tensor, or a list of slot ids) belong to.
        Raises if one is already free."""
        if isinstance(slots, list):
            if self.page_size == 1 and len(slots) <= _FEW:
                self._free_few(slots)
                return
            slots = torch.tensor(slots, dtype=torch.int64)
        if slots.numel() == 0:
            return
        flat = slots.detach().reshape(-1).cpu().numpy()
        pages = flat // self.page_size if self.page_size > 1 else flat
        lo, hi = int(pages.min()), int(pages.max())
        self._check_range(lo, hi)
        uniq = self._distinct(pages)
        already = uniq[self._is_free[uniq]]
        if len(already):
            raise RuntimeError(f"double free: pages {already[:8].tolist()} are already free")
        self._is_free[uniq] = True
        # Pushed in reverse, so pages come back out in the order they were freed.
        self._stack[self._top : self._top + len(uniq)] = uniq[::-1]
        self._top += len(uniq)

    def _free_few(self, slots: list[int]) -> None:
        """`free` of a few slots at page_size 1 (speculative decoding's rejected drafts,
        every verify step), in Python: the same checks and the same stack order as the
        array path, without its ~10 numpy calls, each several microseconds on a step's
        host path right after a forward."""
        if not slots:
            return
        self._check_range(min(slots), max(slots))
        if len(set(slots)) != len(slots):
            twice = sorted({s for s in slots if slots.count(s) > 1})
            raise RuntimeError(f"double free: slots {twice[:8]} appear twice")
        is_free = self._is_free
        already = [s for s in slots if is_free[s]]
        if already:
            raise RuntimeError(f"double free: pages {already[:8]} are already free")
        is_free[slots] = True
        top = self._top
        self._stack[top : top + len(slots)] = slots[::-1]
        self._top = top + len(slots)

    def _check_range(self, lo: int, hi: int) -> None:
        if lo < 1 or hi >= self.num_pages:
            raise ValueError(
                f"slots: pages {lo}..{hi} outside the usable pages 1..{self.num_pages - 1}"
            )

    def _distinct(self, pages: np.ndarray) -> np.ndarray:
        """`pages` without repeats, O(len) and without sorting.

        np.unique sorts (~300 us for 2k slots). Instead, scatter each position into a
        scratch array: exactly one position per distinct page survives the writes (which
        one numpy does not promise, and it does not matter). A repeated slot at
        page_size 1 is a double free within one call.
        """
        pos = np.arange(len(pages), dtype=np.int64)
        self._scratch[pages] = pos
        kept = self._scratch[pages] == pos
        if kept.all():
            return pages
        if self.page_size == 1:
            raise RuntimeError(
                f"double free: slots {np.unique(pages[~kept])[:8].tolist()} appear twice"
            )
        return pages[kept]

    # ---- introspection (tests, debugging) ------------------------------------------------
    def free_slot_mask(self, slots: torch.Tensor) -> torch.Tensor:
        """Bool [len(slots)]: whether each slot's page is free (O(len), for checks)."""
        pages = slots.detach().reshape(-1).cpu().numpy() // self.page_size
        return torch.from_numpy(self._is_free[pages].copy())

    def _page_tail(self, num_tokens: int, last_slot: int | None, num_existing: int) -> np.ndarray:
        """The unused slots of the sequence's last page that the next tokens fill first."""
        used = num_existing % self.page_size
        if used == 0 or num_tokens == 0:
            return np.empty(0, dtype=np.int64)
        if last_slot is None:
            raise ValueError(
                f"last_slot: required when num_existing ({num_existing}) "
                f"is not a multiple of page_size ({self.page_size})"
            )
        if last_slot % self.page_size != used - 1 or self._is_free[last_slot // self.page_size]:
            raise ValueError(
                f"last_slot: {last_slot} is not the last slot of an owned page "
                f"holding {used} token(s)"
            )
        n = min(self.page_size - used, num_tokens)
        return np.arange(last_slot + 1, last_slot + 1 + n, dtype=np.int64)
