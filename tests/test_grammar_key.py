"""The router and the worker compute a constraint's grammar key the same way."""

from __future__ import annotations

import pytest

from radixmesh.grammar_key import grammar_key
from radixmesh.sampling_params import SamplingParams
from radixmesh.v1 import common_pb2
from radixmesh.wire import grammar_key_of, params_to_proto


def test_the_key_is_fixed() -> None:
    # Pinned: routers and workers of one cluster may run different builds.
    assert grammar_key("regex", "[0-9]+") == 0x42175C63C58448F2
    assert grammar_key("regex", "a") != grammar_key("ebnf", "a")


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(regex="[0-9]+"),
        SamplingParams(json_schema='{"type": "object"}'),
        SamplingParams(ebnf='root ::= "a"'),
        SamplingParams(structural_tag='{"type": "structural_tag"}'),
        SamplingParams(choices=("yes", "no")),
    ],
    ids=["regex", "json_schema", "ebnf", "structural_tag", "choices"],
)
def test_router_and_worker_agree(params: SamplingParams) -> None:
    assert params.constraint is not None
    worker_side = grammar_key(*params.constraint)  # what its compile cache announces
    assert grammar_key_of(params_to_proto(params)) == worker_side


def test_no_constraint_has_no_key() -> None:
    assert grammar_key_of(common_pb2.SamplingParams(max_new_tokens=3)) is None
