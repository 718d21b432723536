"""What every radixmesh gRPC server has, shared by the worker's and the router's: the
standard health service and server reflection next to its own service, one port,
plaintext or TLS, and errors ended with the catalogue's status."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from radixmesh.errors import (
    FIELD_METADATA_KEY,
    OVERLOADED_METADATA_KEY,
    InvalidArgument,
    Overloaded,
    Unavailable,
    entry_for,
)

# gRPC sends a status message in a trailer (percent-encoded: up to 3x its UTF-8 size) and
# all trailers together may hold ~16 KB; a longer message would turn the status into
# RESOURCE_EXHAUSTED. Messages and field names are cut to these many UTF-8 bytes.
MAX_STATUS_BYTES = 2048
# gRPC core keeps the calls a server has not picked up yet in a pending queue, and cancels
# those past `max_pending_requests` (1,000 by default): a burst of thousands of streams on
# one connection ended CANCELLED before the server's own admission could answer
# RESOURCE_EXHAUSTED. With room for this many, admission refuses the excess clearly.
PENDING_CALL_OPTIONS = [
    ("grpc.server.max_pending_requests", 16_384),
    ("grpc.server.max_pending_requests_hard_limit", 32_768),
]
MAX_FIELD_CHARS = 128


class _Undecodable:
    """What a request that did not parse deserializes to (the handler answers it)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class DecodeGuard(grpc.aio.ServerInterceptor):
    """A request that is not valid protobuf (a string field with invalid UTF-8, a
    truncated message) gets INVALID_ARGUMENT naming `request`, not gRPC's UNKNOWN.
    Install it first, so that it guards what later interceptors return too."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not (details.method or "").startswith("/radixmesh."):
            return handler  # health and reflection: gRPC's own services
        if handler.unary_unary is None and handler.unary_stream is None:
            return handler  # no client-streaming RPCs here
        return _guarded(handler)


def _guarded(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    parse = handler.request_deserializer

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, UnicodeDecodeError, ValueError) as e:
            return _Undecodable(e)

    async def refuse(request: _Undecodable, context: grpc.aio.ServicerContext) -> NoReturn:
        why = f"the message does not parse (invalid UTF-8 in a string?): {request.error}"
        await abort_rpc(context, InvalidArgument("request", why))

    ser = handler.response_serializer
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            async for item in inner_stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(streaming, deserialize, ser)
    inner = handler.unary_unary

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await refuse(request, context)
        return await inner(request, context)

    return grpc.unary_unary_rpc_method_handler(unary, deserialize, ser)


def add_health_and_reflection(server: grpc.aio.Server, service: str) -> health.aio.HealthServicer:
    """Register `grpc.health.v1` and reflection (listing `service` too); the health
    servicer is returned NOT_SERVING-ready for `set_health`."""
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection(
        (service, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    return servicer


def bind(
    server: grpc.aio.Server,
    address: str,
    tls_cert: str | None,
    tls_key: str | None,
    client_ca: str | None = None,
) -> int:
    """Listen on `address` (TLS when both PEM files are given; with `client_ca`, mutual
    TLS: clients must present a certificate that CA signed); returns the bound port."""
    if tls_cert and tls_key:
        with open(tls_key, "rb") as k, open(tls_cert, "rb") as c:
            pair = (k.read(), c.read())
        if client_ca:
            with open(client_ca, "rb") as f:
                creds = grpc.ssl_server_credentials(
                    [pair], root_certificates=f.read(), require_client_auth=True
                )
        else:
            creds = grpc.ssl_server_credentials([pair])
        return server.add_secure_port(address, creds)
    return server.add_insecure_port(address)


async def set_health(servicer: health.aio.HealthServicer, service: str, *, serving: bool) -> None:
    """Set the overall status and `service`'s."""
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", service):
        await servicer.set(name, status)


async def abort_rpc(context: grpc.aio.ServicerContext, error: BaseException) -> NoReturn:
    """End the RPC with the catalogue's status for `error` (never UNKNOWN); an
    InvalidArgument names its field in the trailing metadata, an Overloaded (and an
    Unavailable that knows) says when to retry. The message is cut to fit in a trailer."""
    entry = entry_for(error)
    metadata: tuple[tuple[str, str], ...] = ()
    message = str(error)
    if isinstance(error, InvalidArgument):
        field = metadata_safe(error.field)
        metadata = ((FIELD_METADATA_KEY, field),)
        message = f"{field}: {error.message}"
    elif isinstance(error, Overloaded) or (
        isinstance(error, Unavailable) and error.retry_after is not None
    ):
        metadata = ((OVERLOADED_METADATA_KEY, f"{error.retry_after:g}"),)
    await context.abort(
        grpc.StatusCode[entry.grpc_status], status_message(message), trailing_metadata=metadata
    )
    raise AssertionError("unreachable: context.abort raises")


def status_message(message: str) -> str:
    """`message` cut to MAX_STATUS_BYTES of UTF-8 (lone surrogates replaced)."""
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_STATUS_BYTES:
        return data.decode()
    return data[:MAX_STATUS_BYTES].decode("utf-8", "ignore") + "... (cut)"


def metadata_safe(field: str) -> str:
    """A field name as a metadata value: printable ASCII, at most MAX_FIELD_CHARS (a
    client's unknown key may be anything)."""
    safe = "".join(ch if " " <= ch <= "~" else "?" for ch in field[:MAX_FIELD_CHARS])
    return safe if len(field) <= MAX_FIELD_CHARS else safe + "..."
