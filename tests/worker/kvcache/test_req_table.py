"""The req->token table's device copy on the GPU's write path (`mirrored`, run on the CPU):
host writes at once, device writes staged and flushed together, never two staged writes
to one entry."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.kvcache.req_table import ReqToTokenTable


def _t(*slots: int) -> torch.Tensor:
    return torch.tensor(slots, dtype=torch.int64)


def test_writes_reach_the_host_at_once_and_the_device_on_sync() -> None:
    t = ReqToTokenTable(max_requests=3, max_context_len=6, mirrored=True)
    assert t.host is not t.table
    t.write(1, 0, _t(4, 5, 6))
    t.write(1, 3, _t(7))  # appends after the staged span: no flush
    t.write_one_each([0, 2], [2, 5], _t(8, 9))
    assert t.host.tolist() == [[0, 0, 8, 0, 0, 0], [4, 5, 6, 7, 0, 0], [0, 0, 0, 0, 0, 9]]
    assert t.table.count_nonzero() == 0 and t.num_staged_writes == 6
    t.sync_device()
    assert t.num_staged_writes == 0
    assert torch.equal(t.table, t.host)
    t.sync_device()  # nothing staged: nothing changes
    assert torch.equal(t.table, t.host)


def test_an_overlapping_write_flushes_first_so_the_last_write_wins() -> None:
    t = ReqToTokenTable(max_requests=2, max_context_len=6, mirrored=True)
    t.write(0, 0, _t(1, 2, 3, 4))
    t.write(0, 0, _t(9, 9))  # the tree's slots replace a prefix: flushes the first write
    assert t.num_staged_writes == 2
    assert t.table[0].tolist() == [1, 2, 3, 4, 0, 0]
    t.write_one_each([0, 1], [1, 0], _t(5, 6))  # row 0 position 1 is staged: flush again
    assert t.num_staged_writes == 2
    t.sync_device()
    assert t.table.tolist() == [[9, 5, 3, 4, 0, 0], [6, 0, 0, 0, 0, 0]]
    assert torch.equal(t.table, t.host)


def test_a_staged_write_keeps_the_slots_it_was_given() -> None:
    t = ReqToTokenTable(max_requests=1, max_context_len=4, mirrored=True)
    slots = _t(1, 2)
    t.write(0, 0, slots)
    slots[0] = 7  # the caller reuses its tensor before the flush
    t.sync_device()
    assert t.table[0].tolist() == [1, 2, 0, 0]


def test_bad_writes_are_refused_before_anything_is_staged() -> None:
    t = ReqToTokenTable(max_requests=2, max_context_len=4, mirrored=True)
    with pytest.raises(ValueError, match="max_context_len"):
        t.write(0, 3, _t(1, 2))
    with pytest.raises(ValueError, match="row"):
        t.write(2, 0, _t(1))
    with pytest.raises(ValueError, match="outside the table"):
        t.write_one_each([0], [4], _t(1))
    assert t.num_staged_writes == 0


def test_the_cpu_table_is_its_own_host_copy() -> None:
    t = ReqToTokenTable(max_requests=1, max_context_len=3)
    assert t.host is t.table and not t.mirrored
    t.write(0, 1, _t(5, 6))
    assert t.table[0].tolist() == [0, 5, 6] and t.num_staged_writes == 0


def test_read_list_is_a_copy_of_the_host_slots() -> None:
    t = ReqToTokenTable(max_requests=2, max_context_len=6, mirrored=True)
    t.write(1, 1, _t(4, 5, 6))
    got = t.read_list(1, 2, 4)
    assert got == [5, 6] and all(type(s) is int for s in got)
    t.write(1, 2, _t(9))
    assert got == [5, 6]
    assert t.read_list(1, 5, 5) == []
    with pytest.raises(ValueError, match="row"):
        t.read_list(2, 0, 1)
