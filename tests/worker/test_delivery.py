"""Which outputs the worker's Generate asks the engine for (`server._delivery`): only those
the call sends on or times."""

from __future__ import annotations

import pytest

from radixmesh.v1 import worker_pb2
from radixmesh.worker.request_output import Delivery
from radixmesh.worker.server import _delivery


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"stream": True}, Delivery.STEPS),
        ({"resumable": True}, Delivery.STEPS),  # a stream may follow its log later
        ({"resumable": True, "first_and_rest": True}, Delivery.STEPS),
        ({"stream": True, "output_stream": "s"}, Delivery.STEPS),
        ({"first_and_rest": True}, Delivery.FIRST_AND_LAST),
        ({"output_stream": "s"}, Delivery.FIRST_AND_LAST),  # sends the first and the last
        ({}, Delivery.FIRST_AND_LAST),  # joined, but the first times the first token
    ],
)
def test_a_call_asks_for_the_outputs_it_sends(
    fields: dict[str, object], expected: Delivery
) -> None:
    assert _delivery(worker_pb2.GenerateRequest(**fields)) is expected  # type: ignore[arg-type]
