"""Which worker failures before the first chunk send a request to another worker."""

from __future__ import annotations

import grpc
import pytest

from radixmesh.router.dispatch import retryable


class _Rpc(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str, metadata: tuple = ()) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(*metadata), details)


@pytest.mark.parametrize(
    ("code", "details", "metadata", "expected"),
    [
        (grpc.StatusCode.UNAVAILABLE, "connection refused", (), True),
        # grpc-core's answer to a call that reached a worker already shutting down
        (grpc.StatusCode.CANCELLED, "CANCELLED", (), True),
        (grpc.StatusCode.CANCELLED, "Locally cancelled by application!", (), False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", (("radixmesh-retry-after", "1"),), True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max", (), False),
        (grpc.StatusCode.INVALID_ARGUMENT, "top_k: must be >= 1", (), False),
        (grpc.StatusCode.ABORTED, "aborted", (), False),
    ],
)
def test_retryable(code: grpc.StatusCode, details: str, metadata: tuple, expected: bool) -> None:
    assert retryable(_Rpc(code, details, metadata)) is expected
