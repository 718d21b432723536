"""The error catalogue: one test per entry (status names, rebuilding on the client side)."""

from __future__ import annotations

import grpc
import pytest

from radixmesh.errors import (
    CATALOGUE,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    NotFound,
    Overloaded,
    PermissionDenied,
    RadixMeshError,
    RequestAborted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    entry_for,
    error_from_status,
)


def _roundtrip(error: RadixMeshError, status: str, http: int) -> RadixMeshError:
    entry = entry_for(error)
    assert (entry.grpc_status, entry.http_status) == (status, http)
    assert grpc.StatusCode[entry.grpc_status].name == status  # a real gRPC status
    field = error.field if isinstance(error, InvalidArgument) else None
    back = error_from_status(status, str(error), field)
    assert type(back) is type(error)
    assert back.grpc_status == status
    return back


def test_unimplemented() -> None:
    back = _roundtrip(Unimplemented("regex", "no grammar backend"), "UNIMPLEMENTED", 501)
    assert isinstance(back, Unimplemented)
    assert (back.field, back.message) == ("regex", "no grammar backend")


def test_invalid_argument() -> None:
    back = _roundtrip(InvalidArgument("top_p", "must be in (0, 1], got 2"), "INVALID_ARGUMENT", 400)
    assert isinstance(back, InvalidArgument)
    assert (back.field, back.message) == ("top_p", "must be in (0, 1], got 2")


def test_overloaded() -> None:
    back = _roundtrip(Overloaded("4 requests in flight"), "RESOURCE_EXHAUSTED", 429)
    assert str(back) == "4 requests in flight"


def test_unavailable() -> None:
    back = _roundtrip(Unavailable("draining"), "UNAVAILABLE", 503)
    assert str(back) == "draining"


def test_deadline_exceeded() -> None:
    _roundtrip(DeadlineExceeded("Deadline Exceeded"), "DEADLINE_EXCEEDED", 504)


def test_unauthenticated() -> None:
    _roundtrip(Unauthenticated("missing or wrong API key"), "UNAUTHENTICATED", 401)


def test_permission_denied() -> None:
    _roundtrip(PermissionDenied("this needs an admin key"), "PERMISSION_DENIED", 403)


def test_request_aborted() -> None:
    _roundtrip(RequestAborted("aborted by the client"), "ABORTED", 409)


def test_not_found() -> None:
    _roundtrip(NotFound("no stream 'x' is held here"), "NOT_FOUND", 404)


def test_internal() -> None:
    _roundtrip(Internal("RuntimeError: boom"), "INTERNAL", 500)


def test_catalogue_has_one_entry_per_class_and_no_unknown() -> None:
    assert len({e.error for e in CATALOGUE}) == len(CATALOGUE) == 10
    assert all(e.grpc_status != "UNKNOWN" for e in CATALOGUE)


@pytest.mark.parametrize(
    ("error", "status"),
    [(RuntimeError("bug"), "INTERNAL"), (ValueError("bad"), "INVALID_ARGUMENT")],
)
def test_unexpected_exceptions_never_map_to_unknown(error: Exception, status: str) -> None:
    assert entry_for(error).grpc_status == status


def test_unknown_status_from_a_foreign_server_is_internal() -> None:
    back = error_from_status("UNKNOWN", "something")
    assert isinstance(back, Internal)
    assert back.grpc_status == "UNKNOWN"
