from __future__ import annotations

import pytest
import torch

from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.req_table import ReqToTokenTable


def _t(*slots: int) -> torch.Tensor:
    return torch.tensor(slots, dtype=torch.int64)


# ---- page_size 1 --------------------------------------------------------------------------
def test_page1_exact_slots_and_lifo_reuse() -> None:
    a = KVAllocator(8)
    assert (a.num_usable_slots, a.num_free_slots, a.num_free_pages) == (7, 7, 7)
    s1 = a.alloc(3)
    assert s1 is not None and s1.dtype == torch.int64
    assert s1.tolist() == [1, 2, 3]
    assert a.alloc(2).tolist() == [4, 5]  # type: ignore[union-attr]
    assert a.num_free_slots == 2
    a.free(_t(3, 1))
    # LIFO: the latest free()'s slots come back first, in the order they were passed.
    assert a.alloc(3).tolist() == [3, 1, 6]  # type: ignore[union-attr]
    assert a.num_free_slots == 1


def test_page1_exhaustion_allocates_nothing() -> None:
    a = KVAllocator(8)
    assert a.alloc(8) is None
    assert a.num_free_slots == 7
    everything = a.alloc(7)
    assert everything is not None and sorted(everything.tolist()) == [1, 2, 3, 4, 5, 6, 7]
    assert a.alloc(1) is None
    assert a.alloc(0).tolist() == []  # type: ignore[union-attr]


def test_page1_double_free_raises() -> None:
    a = KVAllocator(8)
    s = a.alloc(3)
    assert s is not None
    a.free(s)
    with pytest.raises(RuntimeError, match="double free"):
        a.free(s[:1])
    a.alloc(2)
    with pytest.raises(RuntimeError, match="double free"):
        a.free(_t(4, 4))


def test_page1_free_of_a_list_matches_the_tensor_path() -> None:
    # A few slots (speculative decoding's rejected drafts) as a list: the Python path.
    by_list, by_tensor = KVAllocator(16), KVAllocator(16)
    for a in (by_list, by_tensor):
        assert a.alloc(9) is not None  # slots 1..9
    by_list.free([7, 2, 5])
    by_tensor.free(_t(7, 2, 5))
    assert by_list.num_free_slots == by_tensor.num_free_slots == 9
    # LIFO, in the order passed: 7, 2, 5 first, then the untouched 10, 11, ...
    assert by_list.alloc(5).tolist() == by_tensor.alloc(5).tolist() == [7, 2, 5, 10, 11]  # type: ignore[union-attr]
    by_list.free([])
    assert by_list.num_free_slots == 4
    many = list(range(1, 70))  # past the Python path's size: the array path
    big = KVAllocator(80)
    assert big.alloc(69) is not None
    big.free(many)
    assert big.num_free_slots == 79 and big.alloc(2).tolist() == [1, 2]  # type: ignore[union-attr]


def test_page1_free_of_a_list_refuses_what_the_tensor_path_refuses() -> None:
    a = KVAllocator(8)
    assert a.alloc(3) is not None  # slots 1, 2, 3
    with pytest.raises(RuntimeError, match=r"double free: slots \[2\] appear twice"):
        a.free([2, 3, 2])
    a.free([3])
    with pytest.raises(RuntimeError, match=r"double free: pages \[3\] are already free"):
        a.free([1, 3])
    with pytest.raises(ValueError, match="slots"):
        a.free([0])
    with pytest.raises(ValueError, match="slots"):
        a.free([8])
    assert a.num_free_slots == 5  # nothing refused was freed
    a.free([1, 2])
    assert a.num_free_slots == 7


def test_slot_zero_is_never_handed_out_nor_freed() -> None:
    for page_size in (1, 4):
        a = KVAllocator(32, page_size)
        got = a.alloc(a.num_usable_slots)
        assert got is not None and 0 not in got.tolist() and len(set(got.tolist())) == len(got)
        with pytest.raises(ValueError, match="slots"):
            a.free(_t(0))


# ---- page_size 4 --------------------------------------------------------------------------
def test_page4_sizes_and_leftover() -> None:
    a = KVAllocator(22, page_size=4)  # pages 0..4; slots 20, 21 never used
    assert (a.num_pages, a.num_usable_slots, a.num_free_pages, a.num_free_slots) == (5, 16, 4, 16)
    with pytest.raises(ValueError, match="num_slots"):
        KVAllocator(7, page_size=4)


def test_page4_partial_page_filling() -> None:
    a = KVAllocator(22, page_size=4)
    first = a.alloc(6)
    assert first is not None and first.tolist() == [4, 5, 6, 7, 8, 9]
    assert a.num_free_pages == 2
    assert a.pages_needed(3, num_existing=6) == 1
    more = a.alloc(3, last_slot=9, num_existing=6)  # 10, 11 finish page 2; 12 opens page 3
    assert more is not None and more.tolist() == [10, 11, 12]
    assert a.num_free_pages == 1
    tail = a.alloc(2, last_slot=12, num_existing=9)  # fits in page 3: no new page
    assert tail is not None and tail.tolist() == [13, 14]
    assert a.num_free_pages == 1
    assert a.pages_needed(1, num_existing=12) == 1
    assert a.pages_needed(1, num_existing=11) == 0


def test_page4_exhaustion_allocates_nothing() -> None:
    a = KVAllocator(22, page_size=4)
    a.alloc(10)  # pages 1..3, two slots of page 3 spare
    assert a.alloc(5) is None
    assert a.num_free_pages == 1
    assert a.alloc(7, last_slot=13, num_existing=10) is None  # 2 in page 3 + 2 pages
    assert a.num_free_pages == 1
    got = a.alloc(6, last_slot=13, num_existing=10)
    assert got is not None and got.tolist() == [14, 15, 16, 17, 18, 19]
    assert a.num_free_pages == 0


def test_page4_free_by_page_and_double_free() -> None:
    a = KVAllocator(22, page_size=4)
    s = a.alloc(9)  # pages 1, 2, 3 (page 3 holds one token)
    assert s is not None
    a.free(s[[0, 5, 8]])  # one slot of each page frees the whole page
    assert a.num_free_pages == 4
    with pytest.raises(RuntimeError, match="double free"):
        a.free(_t(13))
    assert a.alloc(4).tolist() == [4, 5, 6, 7]  # type: ignore[union-attr]


def test_page4_partial_fill_needs_a_consistent_last_slot() -> None:
    a = KVAllocator(22, page_size=4)
    a.alloc(6)
    with pytest.raises(ValueError, match="last_slot"):
        a.alloc(2, num_existing=6)
    with pytest.raises(ValueError, match="last_slot"):
        a.alloc(2, last_slot=10, num_existing=6)  # 6 tokens end at offset 1 of a page


# ---- request -> token table ---------------------------------------------------------------
def test_req_table_rows_and_writes() -> None:
    t = ReqToTokenTable(max_requests=2, max_context_len=8)
    assert t.table.shape == (2, 8) and t.table.dtype == torch.int64
    r0, r1 = t.alloc_row(), t.alloc_row()
    assert (r0, r1, t.alloc_row(), t.num_free_rows) == (0, 1, None, 0)
    t.write(1, 2, _t(7, 8, 9))
    assert t.table[1].tolist() == [0, 0, 7, 8, 9, 0, 0, 0]
    assert t.read(1, 2, 5).tolist() == [7, 8, 9]
    with pytest.raises(ValueError, match="max_context_len"):
        t.write(1, 6, _t(1, 2, 3))
    t.free_row(1)
    with pytest.raises(RuntimeError, match="double free"):
        t.free_row(1)
    assert t.alloc_row() == 1


# ---- batched decode allocation ------------------------------------------------------------
def test_alloc_next_page1_takes_one_slot_each_in_order() -> None:
    a = KVAllocator(8)
    assert a.alloc(2) is not None  # slots 1, 2
    new = a.alloc_next([5, 9, 1], [])
    assert new is not None and new.tolist() == [3, 4, 5]
    assert a.num_free_slots == 2
    assert a.alloc_next([1, 1, 1], []) is None  # 3 needed, 2 free: nothing taken
    assert a.num_free_slots == 2


def test_alloc_next_page4_matches_one_alloc_per_sequence() -> None:
    # Pages 1-2, 3-4, 5: 6 tokens (last page half used), 8 (page full), 3 (one slot left).
    def setup() -> tuple[KVAllocator, list[int], list[int]]:
        a = KVAllocator(40, page_size=4)
        seqs = [a.alloc(n) for n in (6, 8, 3)]
        assert all(s is not None for s in seqs)
        return a, [6, 8, 3], [int(s[-1]) for s in seqs]  # type: ignore[index]

    one_by_one, existing, last = setup()
    expected = [
        one_by_one.alloc(1, last_slot=s, num_existing=n).tolist()  # type: ignore[union-attr]
        for n, s in zip(existing, last, strict=True)
    ]
    batched, existing, last = setup()
    new = batched.alloc_next(existing, last)
    assert new is not None
    assert new.tolist() == [e[0] for e in expected] == [10, 24, 23]
    assert batched.num_free_pages == one_by_one.num_free_pages == 3


def test_alloc_next_page4_exhaustion_allocates_nothing() -> None:
    a = KVAllocator(12, page_size=4)  # pages 1 and 2 usable
    first = a.alloc(4)
    assert first is not None and a.num_free_pages == 1
    assert a.alloc_next([4, 0], [7, 0]) is None  # two boundaries, one free page
    assert a.num_free_pages == 1
    new = a.alloc_next([4], [7])
    assert new is not None and new.tolist() == [8] and a.num_free_pages == 0


def test_req_table_write_one_each() -> None:
    t = ReqToTokenTable(max_requests=3, max_context_len=4)
    t.write_one_each([2, 0], [1, 3], _t(7, 9))
    assert t.table.tolist() == [[0, 0, 0, 9], [0, 0, 0, 0], [0, 7, 0, 0]]
    with pytest.raises(ValueError, match="outside the table"):
        t.write_one_each([0], [4], _t(1))
    t.write_one_each([], [], _t())
