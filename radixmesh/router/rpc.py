"""The Router service's RPC edge: who called (by key), and how a call ends on error.

A caller is known by a digest of its key (auth.caller_of); a failed call ends with our
error's status (abort_rpc) or a worker's, passed on with its field and retry metadata
(a RESOURCE_EXHAUSTED that is not overload, a gRPC size limit, as INVALID_ARGUMENT).
Every UNAVAILABLE the router sends, its own or a worker's, carries retry-after metadata
(liveness.UNAVAILABLE_RETRY_AFTER unless it knows better), as every HTTP 503 carries
Retry-After: a client is told when trying again makes sense.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc

from radixmesh.auth import caller_of
from radixmesh.client import convert
from radixmesh.errors import (
    FIELD_METADATA_KEY,
    OVERLOADED_METADATA_KEY,
    Internal,
    RadixMeshError,
    Unavailable,
    entry_for,
)
from radixmesh.grpc_server import abort_rpc
from radixmesh.router.liveness import UNAVAILABLE_RETRY_AFTER
from radixmesh.router.metrics import RequestRecord

logger = logging.getLogger(__name__)


def authorization(context: grpc.aio.ServicerContext) -> str | bytes | None:
    """The `authorization` metadata of an RPC (None without one)."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value
    return None


def caller_of_call(context: grpc.aio.ServicerContext) -> str:
    """The caller of an RPC (auth.caller_of its key)."""
    return caller_of(authorization(context))


async def fail(
    context: grpc.aio.ServicerContext,
    e: RadixMeshError | grpc.aio.AioRpcError,
    record: RequestRecord,
) -> NoReturn:
    """End the RPC with our error's status, or a worker's as it came; record which."""
    if isinstance(e, RadixMeshError):
        record.status = entry_for(e).grpc_status
        if isinstance(e, Unavailable) and e.retry_after is None:
            e.retry_after = UNAVAILABLE_RETRY_AFTER
        await abort_rpc(context, e)
    record.status = e.code().name
    await pass_on(context, e)


async def pass_on(context: grpc.aio.ServicerContext, e: grpc.aio.AioRpcError) -> NoReturn:
    """End the RPC with a worker's status, details and field or retry metadata, as they
    came; a RESOURCE_EXHAUSTED that is not overload (a size limit) as INVALID_ARGUMENT."""
    if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not convert.is_overloaded(e):
        await abort_rpc(context, convert.error_from_rpc(e))
    keys = (FIELD_METADATA_KEY, OVERLOADED_METADATA_KEY)
    kept = [(k, v) for k, v in (e.trailing_metadata() or ()) if k in keys]
    if e.code() == grpc.StatusCode.UNAVAILABLE and not kept:
        kept = [(OVERLOADED_METADATA_KEY, f"{UNAVAILABLE_RETRY_AFTER:g}")]
    await context.abort(e.code(), e.details() or "", trailing_metadata=tuple(kept))
    raise AssertionError("unreachable: context.abort raises")


async def unary(
    context: grpc.aio.ServicerContext,
    run: Callable[[], Awaitable[Any]],
    record: RequestRecord | None = None,
) -> Any:
    record = record if record is not None else RequestRecord()
    try:
        return await run()
    except (RadixMeshError, grpc.aio.AioRpcError) as e:
        await fail(context, e, record)
    except Exception as e:
        if isinstance(e, grpc.aio.AbortError):
            raise
        logger.exception("RPC failed")
        record.status = "INTERNAL"
        await abort_rpc(context, Internal(f"{type(e).__name__}: {e}"))
