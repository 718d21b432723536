"""Finding shared prefixes in a decode batch from the slot table's host mirror."""

from __future__ import annotations

import numpy as np

from radixmesh.worker.attention.shared_prefix import (
    MIN_ROWS,
    common_prefix,
    plan_cascade,
)


def table_with_groups(groups: list[tuple[int, int]], own: int, width: int = 256) -> np.ndarray:
    """A table whose rows come in groups (rows, shared tokens): a group's rows hold the same
    slots for its shared tokens, then `own` slots of their own; slots never repeat
    otherwise (the radix cache's invariant)."""
    rows = sum(n for n, _ in groups)
    table = np.zeros((rows + 2, width), dtype=np.int64)  # two spare rows, never read
    slot, r = 1, 0
    for n, shared in groups:
        prefix = np.arange(slot, slot + shared)
        slot += shared
        for _ in range(n):
            table[r, :shared] = prefix
            table[r, shared : shared + own] = np.arange(slot, slot + own)
            slot += own
            r += 1
    return table


def test_common_prefix_is_the_last_column_all_rows_agree_on() -> None:
    table = table_with_groups([(3, 37)], own=5)
    assert common_prefix(table, [0, 1, 2], 41) == 37
    assert common_prefix(table, [0, 1, 2], 20) == 20  # capped
    assert common_prefix(table, [1], 41) == 41  # one row agrees with itself


def test_groups_rows_by_shared_prefix() -> None:
    # Three groups of 4, 5 and 3 rows sharing 100, 60 and 1 tokens, 7 own tokens each.
    table = table_with_groups([(4, 100), (5, 60), (3, 1)], own=7)
    rows = list(range(12))
    rows[1], rows[5] = 5, 1  # batch order need not follow the groups
    seq = [100 + 7] * 4 + [60 + 7] * 5 + [1 + 7] * 3
    seq_lens = [seq[r] for r in rows]
    g = plan_cascade(table, rows, seq_lens)
    assert g is not None
    assert sorted(g.order) == list(range(12))
    starts = np.cumsum([0, *g.sizes])
    found = {
        (tuple(sorted(rows[i] for i in g.order[a:b])), p)
        for a, b, p in zip(starts[:-1], starts[1:], g.prefix_lens, strict=True)
    }
    assert found == {((0, 1, 2, 3), 100), ((4, 5, 6, 7, 8), 60), ((9, 10, 11), 1)}
    saved = 3 * 100 + 4 * 60 + 2 * 1
    assert g.saved_fraction == saved / sum(seq_lens)


def test_a_lone_row_keeps_its_last_token_for_itself() -> None:
    table = table_with_groups([(MIN_ROWS, 50), (1, 30)], own=4)
    rows = list(range(MIN_ROWS + 1))
    g = plan_cascade(table, rows, [54] * MIN_ROWS + [34])
    assert g is not None
    assert g.sizes == [MIN_ROWS, 1] and g.prefix_lens == [50, 33]


def test_prefix_capped_below_the_shortest_row() -> None:
    # Rows that are the shared prefix plus one token: only the last token is their own.
    table = table_with_groups([(MIN_ROWS, 64)], own=1)
    g = plan_cascade(table, list(range(MIN_ROWS)), [65] * MIN_ROWS)
    assert g is not None and g.prefix_lens == [64]
    # A row still inside the prefix (its length 40): the group shares 39 tokens.
    g = plan_cascade(table, list(range(MIN_ROWS)), [40] + [65] * (MIN_ROWS - 1))
    assert g is not None and g.prefix_lens == [39]


def test_no_cascade_when_it_saves_little_or_the_batch_is_small() -> None:
    distinct = table_with_groups([(1, 0)] * 16, own=50)
    assert plan_cascade(distinct, list(range(16)), [50] * 16) is None
    # Sharing 10 of 110 tokens per row saves under MIN_SAVED.
    little = table_with_groups([(16, 10)], own=100)
    assert plan_cascade(little, list(range(16)), [110] * 16) is None
    few = table_with_groups([(MIN_ROWS - 1, 100)], own=2)
    assert plan_cascade(few, list(range(MIN_ROWS - 1)), [102] * (MIN_ROWS - 1)) is None
    # A row of one token has nothing to split.
    one = table_with_groups([(MIN_ROWS, 100)], own=2)
    assert plan_cascade(one, list(range(MIN_ROWS)), [1] + [102] * (MIN_ROWS - 1)) is None


def test_nested_prefixes_split_where_the_parts_save_more() -> None:
    """Every row starts with the same 4 template tokens; 6 rows then share 200 more, 5
    others 120 more, and one row goes on alone: the two deep groups are found (not one
    group over the 4 template tokens), the lone row keeps its own keys."""
    table = np.zeros((14, 256), dtype=np.int64)
    template = [1, 2, 3, 4]
    slot = 5
    deep = []
    for length in (200, 120):
        deep.append(list(range(slot, slot + length)))
        slot += length
    r = 0
    lens = []
    for which, size in enumerate((6, 5)):
        for _ in range(size):
            row = template + deep[which] + list(range(slot, slot + 3))
            slot += 3
            table[r, : len(row)] = row
            lens.append(len(row))
            r += 1
    alone = template + list(range(slot, slot + 40))
    table[r, : len(alone)] = alone
    lens.append(len(alone))
    g = plan_cascade(table, list(range(12)), lens)
    assert g is not None
    firsts = np.cumsum([0, *g.sizes])[:-1].tolist()
    found = sorted(
        (tuple(g.order[a : a + n]), p)
        for a, n, p in zip(firsts, g.sizes, g.prefix_lens, strict=True)
    )
    assert found == [((0, 1, 2, 3, 4, 5), 204), ((6, 7, 8, 9, 10), 124), ((11,), 43)]
    assert g.saved_fraction == (5 * 204 + 4 * 124) / sum(lens)


def test_a_group_stays_whole_where_its_parts_save_less() -> None:
    """10 rows share 300 tokens; then two subsets of 5 share 2 more each: splitting would
    save 2 x 4 x 302 < 9 x 300, so the group stays whole."""
    table = np.zeros((10, 400), dtype=np.int64)
    common = list(range(1, 301))
    slot = 301
    tails = [[slot, slot + 1], [slot + 2, slot + 3]]
    slot += 4
    lens = []
    for r in range(10):
        row = common + tails[r % 2] + [slot]
        slot += 1
        table[r, : len(row)] = row
        lens.append(len(row))
    g = plan_cascade(table, list(range(10)), lens)
    assert g is not None and g.sizes == [10] and g.prefix_lens == [300]
