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
writes take host slots, and the scheduler's bookkeeping (the radix cache's inserts and
frees, a request's own slots) reads the mirror, so it never waits for a step still running
on the device. On the CPU `host` is the table itself.

Writes cost O(1) host calls each, and the device copy is brought up to date once a step.
A step admitting ~60 requests writes ~120 spans (each one's cached prefix and its new
slots); written one at a time to the device that was a pinned copy and a copy kernel each,
~4 CUDA calls an admitted request on the host's critical path. So the mirror is written at
once (numpy slice assignment: ~1 us where a torch indexed write costs ~10-40 us on the
2-core CPU machine), and the device's part of each write is staged: before a forward reads
the table, the model runner takes every staged write (`take_staged`), moves them in the
step's one host-to-device copy of its inputs, and applies them in one `index_copy_`
(`sync_device` does both on its own). Staged writes never overlap: a write that
would overlap one staged for the same row (a request's prefix rewritten with the tree's
slots, a freed row handed to the next request) first flushes the stage, because a scatter
with repeated indices leaves any one of the values. Stream order keeps the device's
view right under the overlap scheduler, as the writes it replaces did: the flush runs
after the step in flight was launched and before the forward that reads it.
"""

from __future__ import annotations

import numpy as np
import torch

from radixmesh.worker.forward_batch import to_device


class ReqToTokenTable:
    def __init__(
        self,
        max_requests: int,
        max_context_len: int,
        device: torch.device | str = "cpu",
        *,
        mirrored: bool | None = None,
    ) -> None:
        """`mirrored` (default: the device is not the CPU): a device table apart from the
        host mirror, written through the staged writes. Tests set it on the CPU to run the
        GPU's write path."""
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
        if mirrored is None:
            mirrored = self.device.type != "cpu"
        self.mirrored = mirrored
        # [max_requests, max_context_len] int64 on the host: the same contents
        self.host = torch.zeros_like(self.table, device="cpu") if mirrored else self.table
        self._host_np = self.host.numpy()  # the same memory, for cheap slice writes
        # Writes the device copy still lacks: flat indices and slots, and per row the end
        # of its staged spans (a write starting before it would overlap one).
        self._staged_index: list[np.ndarray] = []
        self._staged_slots: list[np.ndarray] = []
        self._staged_end: dict[int, int] = {}
        self._free_rows = list(range(max_requests - 1, -1, -1))  # pop() hands out 0 first
        self._is_free = [True] * max_requests

    @property
    def host_array(self) -> np.ndarray:
        """The host mirror as a numpy array (the same memory): read, never write."""
        return self._host_np

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

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record that tokens start .. start+len(slots)-1 of `row` live in `slots` (int64,
        on the host; slots on the device are read back first, which waits for it: fine
        for a benchmark's setup, not for the scheduler's step)."""
        self._check_row(row)
        end = start + slots.numel()
        if start < 0 or end > self.max_context_len:
            raise ValueError(
                f"start: tokens {start}..{end - 1} exceed max_context_len {self.max_context_len}"
            )
        values = _host_array(slots)
        self._host_np[row, start:end] = values
        if self.mirrored and end > start:
            if start < self._staged_end.get(row, 0):
                self.sync_device()  # it would overlap a staged write
            self._staged_index.append(np.arange(start, end) + row * self.max_context_len)
            self._staged_slots.append(values.copy())  # `slots` may be a view that changes
            self._staged_end[row] = end

    def write_one_each(self, rows: list[int], positions: list[int], slots: torch.Tensor) -> None:
        """Record one token per entry: token positions[i] of rows[i] lives in slots[i]
        (int64, on the host; a row repeats only at distinct positions, as a drafting
        row's tokens do).

        One indexed write for a whole decode step instead of one per request. Rows and
        positions come from the scheduler's own counters, so they are checked only for
        range, all at once.
        """
        if not rows:
            return
        if (
            min(rows) < 0
            or max(rows) >= self.max_requests
            or min(positions) < 0
            or max(positions) >= self.max_context_len
        ):
            raise ValueError(f"rows/positions: outside the table {tuple(self.table.shape)}")
        flat = np.asarray(rows, dtype=np.int64) * self.max_context_len
        flat += np.asarray(positions, dtype=np.int64)
        values = _host_array(slots)
        self._host_np.reshape(-1)[flat] = values
        if self.mirrored:
            ends = self._staged_end
            if ends and any(p < ends.get(r, 0) for r, p in zip(rows, positions, strict=True)):
                self.sync_device()
                ends = self._staged_end
            self._staged_index.append(flat)
            self._staged_slots.append(values.copy())
            ends.update(zip(rows, (p + 1 for p in positions), strict=True))

    def sync_device(self) -> None:
        """Bring the device table up to date with the staged writes: one host-to-device
        copy (indices and slots together) and one `index_copy_`, queued on the current
        stream without waiting for it. A no-op when nothing is staged (and on the CPU)."""
        staged = self.take_staged()
        if staged is not None:
            self.apply_staged(to_device(torch.from_numpy(staged), self.device))

    def take_staged(self) -> np.ndarray | None:
        """The staged writes as one int64 array, [flat indices (N) | slots (N)], taken
        off the stage: the caller moves them to the device (with the step's other inputs:
        model_runner.py) and applies them with `apply_staged` before anything reads the
        table there. None when nothing is staged (always on the CPU)."""
        if not self._staged_index:
            return None
        packed = np.concatenate([*self._staged_index, *self._staged_slots])
        self._staged_index, self._staged_slots, self._staged_end = [], [], {}
        return packed

    def apply_staged(self, packed: torch.Tensor) -> None:
        """`take_staged`'s array, on the table's device: one `index_copy_` (queued)."""
        n = packed.numel() // 2
        self.table.view(-1).index_copy_(0, packed[:n], packed[n:])

    @property
    def num_staged_writes(self) -> int:
        """Token entries written on the host that the device copy still lacks."""
        return sum(len(i) for i in self._staged_index)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        """Slots of tokens start .. end-1 of `row`, from the host mirror (a view into it)."""
        self._check_row(row)
        return self.host[row, start:end]

    def read_list(self, row: int, start: int, end: int) -> list[int]:
        """Slots of tokens start .. end-1 of `row` as a list (a copy): a few slots read on
        a step's host path for one call, where a tensor view and its copy take two."""
        self._check_row(row)
        return self._host_np[row, start:end].tolist()

    def _check_row(self, row: int) -> None:
        if not 0 <= row < self.max_requests:
            raise ValueError(f"row: must be in [0, {self.max_requests}), got {row}")


def _host_array(slots: torch.Tensor) -> np.ndarray:
    """`slots` as an int64 numpy array sharing the host tensor's memory."""
    host = slots if slots.device.type == "cpu" else slots.cpu()
    return (host if host.dtype == torch.int64 else host.to(torch.int64)).numpy()
