"""Worker helpers that need no model: the prompt's token-id check."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np
import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.worker.worker import check_token_ids


class Tok(enum.IntEnum):
    A = 5


@pytest.mark.parametrize("ids", [[], [0], [0, 1, 9], list(range(10)) * 160, [Tok.A, 3], [3, Tok.A]])
def test_plain_and_int_subclass_ids_in_range_pass(ids: list[int]) -> None:
    check_token_ids(ids, 10)


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        ([1, 10], "10"),
        ([-3, 5], "-3"),
        ([1, 2, 12, -1], "12"),  # the first bad id is named, not the min or the max
        ([1, True], "True"),
        ([False], "False"),
        ([1, 2.0], "2.0"),
        ([1, "3"], "'3'"),
        ([1, None, 11], "None"),
        ([1, np.int64(3)], repr(np.int64(3))),
        ([Tok.A, 10], "10"),
    ],
)
def test_the_first_bad_id_is_named(ids: list[Any], named: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_token_ids(ids, 10)
    assert err.value.field == "input_ids"
    assert str(err.value) == f"input_ids: token id {named} is outside the vocabulary [0, 10)"
