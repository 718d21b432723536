"""The error catalogue shared by the engine, the servers and the clients.

In-process callers see these exceptions; the gRPC edge maps them to status codes
(`InvalidArgument` -> INVALID_ARGUMENT, `Overloaded` -> RESOURCE_EXHAUSTED,
`Unavailable` -> UNAVAILABLE) and the HTTP edge to 400 / 429 / 503.
"""

from __future__ import annotations


class RadixMeshError(Exception):
    """Base class of every error radixmesh raises on purpose."""


class InvalidArgument(RadixMeshError, ValueError):
    """A request field is invalid. `field` names it (dotted for nested fields)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class Overloaded(RadixMeshError):
    """The worker cannot take more requests now (queue full)."""


class Unavailable(RadixMeshError):
    """The worker is draining, shut down, or failed."""


class RequestAborted(RadixMeshError):
    """The request was aborted before it finished."""
