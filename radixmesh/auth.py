"""API keys: `authorization: Bearer <key>` on gRPC metadata and HTTP headers.

Shared by the worker's and the router's servers (one interceptor, one comparison).

Health checks and reflection stay open (load balancers and `grpcurl list` need them); every
other RPC without a configured key gets UNAUTHENTICATED. Keys are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

DENIED_MESSAGE = "missing or wrong API key (send `authorization: Bearer <key>`)"
ADMIN_MESSAGE = "this needs an admin key (send `authorization: Bearer <admin key>`)"


def bearer_token(authorization: str | bytes | None) -> bytes | None:
    """The token of an `authorization: Bearer <token>` value; None when there is none or
    the value is malformed (bytes that are not UTF-8, characters a header cannot carry)."""
    if authorization is None:
        return None
    try:
        raw = (
            authorization
            if isinstance(authorization, bytes)
            else authorization.encode("utf-8", "strict")
        )
    except UnicodeEncodeError:  # lone surrogates: bytes the server could not decode
        return None
    if not raw.startswith(b"Bearer "):
        return None
    # Only HTTP's optional whitespace (space, tab) is trimmed: a key followed by a \x0b, a
    # \r or a \x0c is another token (aiohttp refuses such a header; gRPC passes it on).
    token = raw.removeprefix(b"Bearer ").strip(b" \t")
    return token or None


def bearer_allowed(authorization: str | bytes | None, keys: Sequence[str]) -> bool:
    """Whether an `authorization` value carries one of `keys` (no keys: everything passes)."""
    if not keys:
        return True
    given = bearer_token(authorization)
    if given is None:
        return False
    # Compare with every key, so the time taken does not tell which one nearly matched.
    return sum(hmac.compare_digest(given, k.encode()) for k in keys) > 0


def caller_of(authorization: str | bytes | None) -> str:
    """Who sent a request, as far as the router can tell: a digest of its key ("" with no
    key). Request ids are scoped to it, so one caller cannot reach another's requests.
    Never the key itself: it may be logged or kept in memory for the request's life."""
    token = bearer_token(authorization)
    return "" if token is None else hashlib.sha256(token).hexdigest()[:16]


@dataclass(frozen=True)
class Roles:
    """What a caller may do beyond its own requests, by the key it sends.

    `admin`: the cluster's operations and details (ClusterStatus, FlushCache, HTTP's
    `/flush_cache` and the workers in `/get_server_info`). With admin keys, an admin key;
    without them every caller the router lets in, as before: the operator named no
    separate role, and the launcher's readiness check (ClusterStatus) then uses an API key.

    `reaches_all`: finding another caller's request by its id (Abort, `/abort_request`).
    With admin keys, an admin key. Without them nobody, once there are API keys: callers
    are known by their keys (`caller_of`) and each finds only its own requests; whoever
    holds an API key must not end another's work. Without any key (an open cluster, the
    demo) everybody: there is no identity to scope by, so every request is everybody's.

    `operator`: seeing the router's internals in replies (which worker served a request:
    gRPC's `worker_id`, HTTP's X-Radixmesh-Worker; HTTP's `/metrics`). The same rule as
    `reaches_all`: with API keys but no admin key nobody, since whoever holds an API key is
    a client, and a client learns nothing of the cluster behind the router.
    """

    api_keys: tuple[str, ...] = field(default=(), repr=False)
    admin_keys: tuple[str, ...] = field(default=(), repr=False)

    def admin(self, authorization: str | bytes | None) -> bool:
        return not self.admin_keys or bearer_allowed(authorization, self.admin_keys)

    def reaches_all(self, authorization: str | bytes | None) -> bool:
        if self.admin_keys:
            return bearer_allowed(authorization, self.admin_keys)
        return not self.api_keys

    def operator(self, authorization: str | bytes | None) -> bool:
        return self.reaches_all(authorization)


Outcome = Callable[[str, bool], None]


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Denies RPCs without a valid key; `on_deny(method)` is called for each denial.

    `on_outcome(peer, ok)`: told, for each call that needs a key, whether it had one and
    on which connection (`context.peer()`), so that the gate (gate.py) can keep the
    connections that authenticate and close the ones that do not. Only the handler knows
    the peer, so each such call runs inside one more (thin) handler."""

    _OPEN = ("/grpc.health.v1.Health/", "/grpc.reflection.")

    def __init__(
        self,
        keys: Sequence[str],
        on_deny: Callable[[str], None] = lambda method: None,
        on_outcome: Outcome | None = None,
    ) -> None:
        self.keys = tuple(keys)
        self.on_deny = on_deny
        self.on_outcome = on_outcome

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:  # an unknown method: let gRPC answer UNIMPLEMENTED
            return handler
        method = details.method or ""
        authorization = dict(details.invocation_metadata or ()).get("authorization")
        if method.startswith(self._OPEN):
            return handler
        if bearer_allowed(authorization, self.keys):
            if self.on_outcome is None:
                return handler
            return _reported(handler, self.on_outcome)
        self.on_deny(method)
        return _deny(handler, self.on_outcome)


def _reported(handler: grpc.RpcMethodHandler, on_outcome: Outcome) -> grpc.RpcMethodHandler:
    """`handler`, telling `on_outcome` its call's peer authenticated. grpc.aio calls a
    streaming handler as an async generator function (or a coroutine function that
    writes), so the wrapper is of the same kind as the handler it wraps."""
    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream
        if inspect.isasyncgenfunction(inner_stream):

            async def streaming(
                request: Any, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                on_outcome(context.peer(), True)
                async for item in inner_stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(streaming, des, ser)

        async def writing(request: Any, context: grpc.aio.ServicerContext) -> Any:
            on_outcome(context.peer(), True)
            return await inner_stream(request, context)

        return grpc.unary_stream_rpc_method_handler(writing, des, ser)
    if handler.unary_unary is None:
        return handler  # no client-streaming RPCs here
    inner = handler.unary_unary

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        on_outcome(context.peer(), True)
        return await inner(request, context)

    return grpc.unary_unary_rpc_method_handler(unary, des, ser)


def _deny(handler: grpc.RpcMethodHandler, on_outcome: Outcome | None) -> grpc.RpcMethodHandler:
    def denied(context: grpc.aio.ServicerContext) -> None:
        if on_outcome is not None:
            on_outcome(context.peer(), False)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        denied(context)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED_MESSAGE)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        denied(context)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED_MESSAGE)
        yield None  # pragma: no cover (makes this an async generator)

    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, des, ser)
    return grpc.unary_unary_rpc_method_handler(unary, des, ser)


def with_api_key(authorization: str | None, api_key: str | None) -> str | None:
    """The `authorization` of an HTTP request that may carry its key as `x-api-key: <key>`
    (Anthropic's clients do): `Bearer <key>` when no `authorization` came with it."""
    if authorization is None and api_key is not None:
        return f"Bearer {api_key}"
    return authorization
