"""ReqToTokenTable: where each token of each running request keeps its KV.

`table[row, i]` is the KV slot of token i of the request that holds `row`. Attention
reads a sequence's KV through its row, so a request's tokens need not sit in consecutive
slots. Rows are handed out LIFO from a free list; a row's contents are garbage once
freed, and the table starts zeroed so never-written entries point at the reserved padding
slot 0 (harmless for padded CUDA-graph batches).

Ownership: the scheduler allocates a row when it admits a request and frees it when the
request finishes or is preempted; the table owns no KV slots (the allocator and the radix
cache do). Not thread-safe: the scheduler thread is the only caller.

On a GPU the table lives on the device (attention reads it there) and `host` mirrors it:
writes take host slots and go to both, and the scheduler's bookkeeping (the radix cache's
inserts and frees, a request's own slots) reads the mirror, so it never waits for a step
still running on the device. On the CPU `host` is the table itself.
"""

from __future__ import annotations

import torch

from radixmesh.worker.forward_batch import to_device


class ReqToTokenTable:
    def __init__(
        self, max_requests: int, max_context_len: int, device: torch.device | str = "cpu"
    ) -> None:
        if max_requests < 1:
            raise ValueError(f"max_requests: must be >= 1, got {max_requests}")
        if max_context_len < 1:
            raise ValueError(f"max_context_len: must be >= 1, got {max_context_len}")
        self.max_requests = max_requests
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        # [max_requests, max_context_len] int64
        self.table = torch.zeros(
            (max_requests, max_context_len), dtype=torch.int64, device=self.device
        )
        # [max_requests, max_context_len] int64 on the host: the same contents
        self.host = (
            self.table if self.device.type == "cpu" else torch.zeros_like(self.table, device="cpu")
        )
        self._free_rows = list(range(max_requests - 1, -1, -1))  # pop() hands out 0 first
        self._is_free = [True] * max_requests

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int | None:
        """A free row, or None when every row is taken."""
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self._is_free[row] = False
        return row

    def free_row(self, row: int) -> None:
        """Give `row` back. Raises on a row that is already free."""
        self._check_row(row)
        if self._is_free[row]:
            raise RuntimeError(f"double free: row {row} is already free")
        self._is_free[row] = True
        self._free_rows.append(row)

    def write(
        self, row: int, start: int, slots: torch.Tensor, on_device: torch.Tensor | None = None
    ) -> None:
        """Record that tokens start .. start+len(slots)-1 of `row` live in `slots` (on the
        host; `on_device`: the same slots, already copied to the table's device)."""
        self._check_row(row)
        end = start + slots.numel()
        if start < 0 or end > self.max_context_len:
            raise ValueError(
                f"start: tokens {start}..{end - 1} exceed max_context_len {self.max_context_len}"
            )
        self.host[row, start:end] = slots
        if self.host is not self.table:
            self.table[row, start:end] = on_device if on_device is not None else self._to(slots)

    def write_one_each(
        self,
        rows: list[int],
        positions: list[int],
        slots: torch.Tensor,
        on_device: torch.Tensor | None = None,
    ) -> None:
        """Record one token per row: token positions[i] of rows[i] lives in slots[i].

        One indexed write for a whole decode step instead of a copy (on CUDA a kernel) per
        request. Rows and positions come from the scheduler's own counters, so they are
        checked only for range, all at once.
        """
        if rows and (
            min(rows) < 0
            or max(rows) >= self.max_requests
            or min(positions) < 0
            or max(positions) >= self.max_context_len
        ):
            raise ValueError(f"rows/positions: outside the table {tuple(self.table.shape)}")
        index = torch.tensor([rows, positions], dtype=torch.int64)  # [2, B]
        self.host[index[0], index[1]] = slots
        if self.host is not self.table:
            index = self._to(index)
            self.table[index[0], index[1]] = on_device if on_device is not None else self._to(slots)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        """Slots of tokens start .. end-1 of `row`, from the host mirror (a view into it)."""
        self._check_row(row)
        return self.host[row, start:end]

    def _to(self, t: torch.Tensor) -> torch.Tensor:
        return to_device(t, self.device)

    def _check_row(self, row: int) -> None:
        if not 0 <= row < self.max_requests:
            raise ValueError(f"row: must be in [0, {self.max_requests}), got {row}")
