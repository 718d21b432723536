"""Which rows of a decode batch share a cached prefix, read off the slot table's host mirror.

The radix cache hands every request that matches a tree node that node's KV slots, and a
slot holds one token's KV in one context. So two rows holding the same slot at position c
share the same tree path up to c: equal slots at c imply equal slots at every earlier
position. Sharing is then cheap to find: rows are grouped by their first slot (a row
shares nothing with a row whose first slot differs), and a group's common prefix is the
largest c at which all its rows hold the same slot at c - 1, found by binary search over
c (O(rows x log length), no row is read in full).

One level only: each row reads one shared prefix, then its own keys. Where rows nest
(every request starts with the same chat template's tokens, and subsets go on with
different system prompts or documents), a group splits by the slot after its common
prefix whenever its parts, each over its longer prefix, save more reads than the group
whole (`_best_groups`, recursively): a row that shares only a template's first tokens
with the others does not cut their 1,536-token prefix down to those tokens.

A cascade pays when it saves reads: `plan_cascade` returns groups only when the
prefixes, read once per group instead of once per row, save at least MIN_SAVED of the
batch's KV reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_SAVED = 0.25  # fraction of the batch's KV tokens the shared reads must save
MIN_ROWS = 8  # below this a decode step is launch-bound, not read-bound


@dataclass(frozen=True)
class CascadeGroups:
    """The batch's rows in group order and each group's shared prefix length."""

    order: list[int]  # batch indices, each group's rows consecutive
    sizes: list[int]  # rows per group, in order
    prefix_lens: list[int]  # tokens every row of the group shares (>= 1; a lone row: all
    # but its last), so that both levels of a cascade have keys for every row
    saved_fraction: float  # KV reads saved against reading every row in full


def common_prefix(host_table: np.ndarray, rows: list[int], limit: int, agreed: int = 0) -> int:
    """Tokens (at most `limit`) that every row of `rows` holds in the same slots, given
    that they agree on the first `agreed`."""
    lo, hi = agreed, limit  # invariant: all rows agree on [0, lo)
    first = rows[0]
    if lo < hi and not (host_table[rows, lo] == host_table[first, lo]).all():
        return lo  # they part at once (a batch's groups by their first slot): no search
    while lo < hi:
        mid = (lo + hi + 1) // 2
        column = host_table[rows, mid - 1]
        if (column == host_table[first, mid - 1]).all():
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_cascade(
    host_table: np.ndarray, req_rows: list[int], seq_lens: list[int]
) -> CascadeGroups | None:
    """Group a decode batch's rows (table rows `req_rows`, lengths `seq_lens`) by shared
    prefix, or None when sharing would save less than MIN_SAVED of the reads. Each row
    keeps at least its last token out of the shared part, so every row has its own."""
    n = len(req_rows)
    if n < MIN_ROWS or min(seq_lens) < 2:
        return None
    groups = _best_groups(host_table, req_rows, seq_lens, list(range(n)), 0)[1]
    order: list[int] = []
    sizes: list[int] = []
    prefixes: list[int] = []
    saved = 0
    for members, shared in groups:
        order += members
        sizes.append(len(members))
        prefixes.append(shared)
        saved += (len(members) - 1) * shared
    fraction = saved / sum(seq_lens)
    if fraction < MIN_SAVED:
        return None
    return CascadeGroups(order, sizes, prefixes, fraction)


def _best_groups(
    host_table: np.ndarray, req_rows: list[int], seq_lens: list[int], members: list[int],
    agreed: int,
) -> tuple[int, list[tuple[list[int], int]]]:  # fmt: skip
    """(reads saved, [(batch indices, shared prefix)]) for `members`, which agree on their
    first `agreed` slots: the group whole over its common prefix, or split by the slot
    after it into parts grouped the same way, whichever saves more. A prefix of 0 always
    splits (the first slots differ); a lone row shares all but its last token."""
    limit = min(seq_lens[i] for i in members) - 1
    if len(members) == 1:
        return 0, [(members, limit)]
    rows = [req_rows[i] for i in members]
    shared = common_prefix(host_table, rows, limit, agreed)
    whole = (len(members) - 1) * shared
    if shared >= limit and shared > 0:  # a row has no token past it to split on
        return whole, [(members, shared)]
    column = host_table[rows, shared]
    if shared > 0 and np.unique(column).size == len(members):  # all lone: splitting saves 0
        return whole, [(members, shared)]
    parts: dict[int, list[int]] = {}
    for i, slot in zip(members, column.tolist(), strict=True):
        parts.setdefault(slot, []).append(i)
    saved, groups = 0, []
    for part in parts.values():
        if len(part) == 1:
            groups.append((part, seq_lens[part[0]] - 1))
            continue
        s, g = _best_groups(host_table, req_rows, seq_lens, part, shared + 1)
        saved += s
        groups += g
    if shared > 0 and whole >= saved:
        return whole, [(members, shared)]
    return saved, groups
