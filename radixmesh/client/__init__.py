"""The radixmesh gRPC client SDK (sync `Client`, asyncio `AsyncClient`).

Errors are the catalogue's typed exceptions (`radixmesh.errors`), each carrying the gRPC
status name in `grpc_status`; INVALID_ARGUMENT errors name the field in `.field`.
"""

from __future__ import annotations

from radixmesh.client.async_client import AsyncClient
from radixmesh.client.client import Client
from radixmesh.client.types import (
    Chunk,
    Completion,
    Embedding,
    Load,
    ModelInfo,
    ProgramHint,
    Selection,
    TokenLogprob,
)
from radixmesh.errors import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    Overloaded,
    PermissionDenied,
    RadixMeshError,
    RequestAborted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)

__all__ = [
    "AsyncClient",
    "Chunk",
    "Client",
    "Completion",
    "DeadlineExceeded",
    "Embedding",
    "Internal",
    "InvalidArgument",
    "Load",
    "ModelInfo",
    "Overloaded",
    "PermissionDenied",
    "ProgramHint",
    "RadixMeshError",
    "RequestAborted",
    "Selection",
    "TokenLogprob",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
]
