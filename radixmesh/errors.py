"""The error catalogue shared by the engine, the servers and the clients.

In-process callers see these exceptions; the gRPC edge maps them to status codes
(`InvalidArgument` -> INVALID_ARGUMENT, `Overloaded` -> RESOURCE_EXHAUSTED,
`Unavailable` -> UNAVAILABLE) and the HTTP edge to 400 / 429 / 503.
"""

from __future__ import annotations

from dataclasses import dataclass

# gRPC trailing metadata naming the field of an INVALID_ARGUMENT (set by the servers, read
# by the client and by the router when it relays a worker's error).
FIELD_METADATA_KEY = "radixmesh-field"
# Trailing metadata of a RESOURCE_EXHAUSTED that a radixmesh server sent because it is
# overloaded (`Overloaded`), with the seconds after which a retry may succeed. gRPC itself
# answers RESOURCE_EXHAUSTED for a message or metadata over its size limits: without this
# key the status means the request is too large, which no other server takes either. The
# router sends it with its UNAVAILABLE too (`Unavailable.retry_after`: no healthy worker,
# still starting, shutting down), as it sends HTTP 503 with a Retry-After header.
OVERLOADED_METADATA_KEY = "radixmesh-retry-after"
# Trailing metadata of a router's UNAVAILABLE that ends a resumable stream because the
# router is shutting down: its worker holds the request, and the client resumes it
# elsewhere. A router's other UNAVAILABLEs (a worker died or stalled) end the stream.
RESUME_METADATA_KEY = "radixmesh-resume"


class RadixMeshError(Exception):
    """Base class of every error radixmesh raises on purpose."""

    # The gRPC status name, on errors the client rebuilt from a status.
    grpc_status: str | None = None


class InvalidArgument(RadixMeshError, ValueError):
    """A request field is invalid. `field` names it (dotted for nested fields)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class Overloaded(RadixMeshError):
    """The worker or router cannot take more requests now (queue full, rate limited).
    `retry_after`: seconds after which a retry may succeed."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(RadixMeshError):
    """The worker is draining, shut down, or failed; or the router has no worker for the
    request. `retry_after`: seconds after which a retry may succeed, when the server said
    (None: it did not)."""

    def __init__(self, message: str = "", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestAborted(RadixMeshError):
    """The request was aborted before it finished."""


class Unimplemented(InvalidArgument):
    """A valid request for a feature this worker does not implement (yet)."""


class DeadlineExceeded(RadixMeshError):
    """The caller's deadline passed before the request finished."""


class Unauthenticated(RadixMeshError):
    """The API key is missing or wrong."""


class PermissionDenied(RadixMeshError):
    """The API key is valid but not allowed this (an admin RPC without an admin key)."""


class NotFound(RadixMeshError):
    """What the request names is not there (a stream to resume that no worker holds)."""


class Internal(RadixMeshError):
    """A bug: the server failed in a way the request did not cause."""


@dataclass(frozen=True)
class CatalogueEntry:
    """One error: its exception, gRPC status name, HTTP status and what causes it."""

    error: type[RadixMeshError]
    grpc_status: str  # a grpc.StatusCode name (no grpc import in this shared module)
    http_status: int
    cause: str


# Most specific first: `entry_for` takes the first entry the exception is an instance of.
CATALOGUE: tuple[CatalogueEntry, ...] = (
    CatalogueEntry(Unimplemented, "UNIMPLEMENTED", 501, "a feature not implemented here"),
    CatalogueEntry(
        InvalidArgument,
        "INVALID_ARGUMENT",
        400,
        "an invalid sampling field, a prompt too long for the context, or empty input",
    ),
    CatalogueEntry(Overloaded, "RESOURCE_EXHAUSTED", 429, "the request queue is full"),
    CatalogueEntry(Unavailable, "UNAVAILABLE", 503, "draining, loading or shut down"),
    CatalogueEntry(DeadlineExceeded, "DEADLINE_EXCEEDED", 504, "the caller's deadline passed"),
    CatalogueEntry(Unauthenticated, "UNAUTHENTICATED", 401, "a missing or wrong API key"),
    CatalogueEntry(PermissionDenied, "PERMISSION_DENIED", 403, "an admin RPC without an admin key"),
    CatalogueEntry(RequestAborted, "ABORTED", 409, "the request was aborted"),
    CatalogueEntry(NotFound, "NOT_FOUND", 404, "a stream to resume that no worker holds"),
    CatalogueEntry(Internal, "INTERNAL", 500, "a server bug"),
)


def entry_for(error: BaseException) -> CatalogueEntry:
    """The catalogue entry of an exception; anything unexpected is INTERNAL, never UNKNOWN."""
    for entry in CATALOGUE:
        if isinstance(error, entry.error):
            return entry
    if isinstance(error, ValueError):
        return CATALOGUE[1]
    return CATALOGUE[-1]


def error_from_status(grpc_status: str, message: str, field: str | None = None) -> RadixMeshError:
    """Rebuild the typed exception from a status (the client side of `entry_for`).

    `message` is the status details; for INVALID_ARGUMENT / UNIMPLEMENTED it reads
    "<field>: <message>" and `field` (sent as trailing metadata) is split off again.
    """
    for entry in CATALOGUE:
        if entry.grpc_status != grpc_status:
            continue
        if issubclass(entry.error, InvalidArgument):
            name = field or "request"
            text = message.removeprefix(f"{name}: ")
            error: RadixMeshError = entry.error(name, text)
        else:
            error = entry.error(message)
        error.grpc_status = grpc_status
        return error
    fallback: RadixMeshError = (
        RequestAborted(message) if grpc_status == "CANCELLED" else Internal(message)
    )
    fallback.grpc_status = grpc_status
    return fallback
