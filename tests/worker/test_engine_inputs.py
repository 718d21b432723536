"""engine_inputs.normalize_inputs: each prompt's ids as a tuple of its own."""

from __future__ import annotations

import gc

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.tokenizer import ByteTokenizer
from radixmesh.worker.engine_inputs import normalize_inputs

TOK = ByteTokenizer(512)


def test_ids_become_tuples_of_their_own() -> None:
    one = [5, 6, 7]
    assert normalize_inputs(TOK, None, one) == ([(5, 6, 7)], True)
    many = [[5, 6], [7]]
    got, single = normalize_inputs(TOK, None, many)
    assert (got, single) == ([(5, 6), (7,)], False)
    many[0].append(8)  # the caller's lists may change after the call
    assert got == [(5, 6), (7,)]


def test_text_prompts_become_tuples() -> None:
    assert normalize_inputs(TOK, "hi", None) == ([(104, 105)], True)
    assert normalize_inputs(TOK, ["a", "bc"], None) == ([(97,), (98, 99)], False)


def test_the_collector_stops_tracking_a_prompt() -> None:
    """Why tuples: after one collection, no collection visits a prompt's ids again."""
    (ids,), _ = normalize_inputs(TOK, None, [[300 + i for i in range(1600)]])
    gc.collect()
    assert not gc.is_tracked(ids)


@pytest.mark.parametrize(
    "input_ids",
    [[], [[1], 2], [True, 2], "12", [(1, 2)]],
    ids=["empty", "mixed", "bool", "str", "tuple"],
)
def test_bad_ids_are_refused(input_ids: object) -> None:
    with pytest.raises(InvalidArgument) as err:
        normalize_inputs(TOK, None, input_ids)  # type: ignore[arg-type]
    assert err.value.field == "input_ids"
