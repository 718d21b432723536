"""HTTP error replies in OpenAI's layout: `{"error": {"message", "type", "param", "code"}}`.

Shared by every HTTP handler of the router (http.py, the OpenAI and SGLang routes; the
Messages API renders the same objects in its layout): the status is the error catalogue's,
`param` names the field in the spelling the client sent, cut and with its unprintable
characters escaped (an unknown field's name is whatever the client sent), and the message
is cut too. `JsonErrors` answers the requests aiohttp cannot parse without echoing them.
`read_json` reads a request's body with its errors as these replies.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable
from typing import Any

import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from radixmesh.client.convert import error_from_rpc
from radixmesh.errors import CATALOGUE, InvalidArgument, Overloaded, Unavailable, entry_for
from radixmesh.redact import label
from radixmesh.router.http.openai.convert import openai_field
from radixmesh.router.limits import RequestLimits, parse_json
from radixmesh.router.liveness import UNAVAILABLE_RETRY_AFTER

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}
# HTTP status -> the gRPC status name requests are counted under (metrics.py).
STATUS_NAMES = {200: "OK", 404: "NOT_FOUND", 405: "UNIMPLEMENTED", 408: "DEADLINE_EXCEEDED"} | {
    e.http_status: e.grpc_status for e in CATALOGUE
}
STATUS_KEY = "radixmesh_status"  # request key: a status that the HTTP status does not show
MAX_PARAM = 64  # characters of a field's name an error shows (real ones are shorter)
MAX_MESSAGE = 2048  # characters of an error's message (as gRPC's trailers carry)


class ApiError(Exception):
    """An error reply: HTTP status, message, the offending field and a short code."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        message, param = _shown(message, param)
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        # Seconds: the Retry-After header of a 429 or a 503 (a 503 always has one).
        self.retry_after = retry_after

    @classmethod
    def from_exception(
        cls, e: BaseException, field_name: Callable[[str], str] = openai_field
    ) -> ApiError:
        """`field_name` maps the field an InvalidArgument names to the client's spelling,
        in the message too: a worker's "prompt + max_new_tokens exceeds the context"
        reaches an OpenAI client as `max_tokens` (or `max_completion_tokens`, as sent), an
        Anthropic one as `max_tokens`, never under a name the client did not send."""
        if isinstance(e, grpc.aio.AioRpcError):
            e = error_from_rpc(e)
        entry = entry_for(e)
        if isinstance(e, InvalidArgument):
            name = field_name(e.field)
            message = _renamed(e.message, e.field.removeprefix("sampling_params."), name)
            return cls(entry.http_status, message, name, "invalid_argument")
        after = e.retry_after if isinstance(e, Overloaded | Unavailable) else None
        return cls(entry.http_status, str(e), None, entry.grpc_status.lower(), after)

    def to_json(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        after = self.retry_after
        if after is None and self.status == 503:
            after = UNAVAILABLE_RETRY_AFTER  # every 503 says when to come back
        headers = retry_after_header(after) if after is not None else {}
        return web.json_response(self.to_json(), status=self.status, headers=headers)


def _shown(message: str, param: str | None) -> tuple[str, str | None]:
    """The message and field an error reply may show: a field's name is the client's own
    text (an unknown field can be 10 KB, terminal escapes, a piece of a key), so it is cut
    and its unprintable characters escaped (redact.label), where it is named and inside the
    message; the message is cut to MAX_MESSAGE characters."""
    if param is not None:
        shown = label(param, MAX_PARAM)
        if shown != param:
            for written in (param, repr(param)[1:-1], json.dumps(param)[1:-1]):
                message = message.replace(written, shown)
            param = shown
    if len(message) > MAX_MESSAGE:
        message = f"{message[:MAX_MESSAGE]}... ({len(message)} characters)"
    if not message.isprintable():  # line breaks stay (a compiler's message has them)
        message = "".join(c if c.isprintable() or c in "\n\t" else ascii(c)[1:-1] for c in message)
    return message, param


def _renamed(message: str, internal: str, client: str) -> str:
    """`message` with the field's internal name, as a whole word, in the client's."""
    if internal == client or not internal:
        return message
    return re.sub(rf"(?<![\w.]){re.escape(internal)}(?!\w)", client, message)


def retry_after_header(seconds: float) -> dict[str, str]:
    """The Retry-After header: whole seconds, at least one (RFC 9110)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


async def read_json(
    request: web.Request, limits: RequestLimits, context_length: int | None = None
) -> Any:
    """The body as JSON (router/limits.py), its counts and prompt text within the limits
    (each prompt of token ids within `context_length`), before anything parses it."""
    try:
        body = await parse_json(await request.read())
    except InvalidArgument as e:
        if e.field != "body":  # a field that no text can hold (a lone surrogate)
            raise ApiError(400, e.message, e.field, "invalid_argument") from None
        raise ApiError(400, e.message, None, "invalid_json") from None
    limits.check_body(body, context_length)
    return body


class JsonErrors(RequestHandler):
    """aiohttp's handler of one connection, whose reply to a request aiohttp cannot parse
    (a 400 for a malformed head, a 413 or 431 for one too large) is this module's JSON,
    naming the kind of error only: aiohttp's own reply quotes the line it could not parse,
    a malformed `Authorization` header's key and all, and a proxy in front may log it."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        plain = super().handle_error(request, status, exc, None)  # logs it; closes after
        if status == 500:
            return plain  # aiohttp's says nothing about the request
        reason = type(exc).__name__ if exc is not None else "malformed"
        reply = ApiError(status, f"the request could not be parsed ({reason})", None, "bad_request")
        response = reply.response()
        response.force_close()
        return response


def json_errors(factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
    """`factory` (aiohttp's `web.Server`) with its connections' handlers `JsonErrors`."""

    def make() -> asyncio.Protocol:
        handler = factory()
        if type(handler) is RequestHandler:
            handler.__class__ = JsonErrors  # the same object, its error replies this module's
        return handler

    return make
