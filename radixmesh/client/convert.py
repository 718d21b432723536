"""The SDK's types from radixmesh.v1 messages (their fields read by `radixmesh.wire`),
and gRPC errors -> the error catalogue."""

from __future__ import annotations

import dataclasses
import email.utils
import math
import time
from collections.abc import Sequence
from typing import Any

import grpc

from radixmesh import wire
from radixmesh.errors import (
    FIELD_METADATA_KEY,
    OVERLOADED_METADATA_KEY,
    Overloaded,
    RadixMeshError,
    Unavailable,
    error_from_status,
)
from radixmesh.v1 import common_pb2, router_pb2, worker_pb2

from .types import Chunk, Completion, Embedding, Load, ModelInfo, Selection, TokenLogprob

# What a request sends, built where every edge builds it (the SDK's names for them).
make_input = wire.input_to_proto
make_params = wire.params_to_proto
score_request = wire.score_request
pooling = wire.pooling_to_proto


def _logprobs(pairs: list[tuple[int, float | None]]) -> list[TokenLogprob]:
    return [TokenLogprob(tid, lp) for tid, lp in pairs]


def _typed(fields: dict[str, Any]) -> dict[str, Any]:
    fields["logprobs"] = _logprobs(fields["logprobs"])
    fields["top_logprobs"] = [_logprobs(t) for t in fields["top_logprobs"]]
    fields["input_logprobs"] = _logprobs(fields["input_logprobs"])
    fields["input_top_logprobs"] = [_logprobs(t) for t in fields["input_top_logprobs"]]
    return fields


def served_by(resp: Any) -> str:
    """The serving worker's id: a router's responses carry it, a worker's own do not."""
    return str(getattr(resp, "worker_id", ""))


def chunk_from_proto(c: common_pb2.GenerateChunk, worker_id: str = "") -> Chunk:
    fields = _typed(wire.chunk_fields(c))
    del fields["input_logprobs"], fields["input_top_logprobs"]  # the Completion's alone
    return Chunk(**fields, worker_id=worker_id)


def completion_from_proto(c: common_pb2.GenerateChunk, worker_id: str = "") -> Completion:
    return Completion(**_typed(wire.chunk_fields(c)), worker_id=worker_id)


def join_chunks(chunks: Sequence[Chunk]) -> Completion:
    """A streamed generation's chunks as one Completion."""
    last = chunks[-1]
    return Completion(
        **{
            **{f.name: getattr(last, f.name) for f in dataclasses.fields(Chunk)},
            "token_ids": [t for c in chunks for t in c.token_ids],
            "text": "".join(c.text for c in chunks),
            "logprobs": [lp for c in chunks for lp in c.logprobs],
            "top_logprobs": [t for c in chunks for t in c.top_logprobs],
        }
    )


def model_info_from_proto(m: common_pb2.ModelInfo) -> ModelInfo:
    return ModelInfo(**wire.model_info_fields(m))


def load_from_proto(m: worker_pb2.GetLoadResponse) -> Load:
    return Load(**wire.load_fields(m))


def embedding_from_proto(e: common_pb2.Embedding, worker_id: str = "") -> Embedding:
    return Embedding(**wire.embedding_fields(e), worker_id=worker_id)


def selection_from_scores(choices: Sequence[str], resp: worker_pb2.ScoreResponse) -> Selection:
    """The choice with the best mean token logprob (the first of equals)."""
    sums = [s for s, _ in wire.score_sums(resp)]
    means = [s / max(n, 1) for s, n in wire.score_sums(resp)]
    best = max(range(len(means)), key=lambda i: (means[i], -i))
    return Selection(best, choices[best], means, sums)


def selection_from_proto(resp: router_pb2.SelectResponse) -> Selection:
    return Selection(**wire.selection_fields(resp))


# gRPC Python's details for a call this process cancelled itself.
LOCAL_CANCELLATION = "Locally cancelled by application!"


def _dropped_by_server(e: grpc.RpcError) -> bool:
    """A CANCELLED this process did not ask for. Our servers never cancel a call (an abort
    is ABORTED), but grpc-core cancels a call that reached a server already shutting down
    before a handler took it (a known grpc-core bug, reported upstream: it should say
    UNAVAILABLE)."""
    return bool(e.code() == grpc.StatusCode.CANCELLED and e.details() != LOCAL_CANCELLATION)


def server_went_away(e: grpc.RpcError) -> bool:
    """Whether the server was gone or going when the call failed, so it did nothing and
    another server may take it: UNAVAILABLE, or a CANCELLED the server side made."""
    return bool(e.code() == grpc.StatusCode.UNAVAILABLE or _dropped_by_server(e))


# How grpc-core's load balancing policies fail a call while they have no connection
# (pick_first's and round_robin's pickers in TRANSIENT_FAILURE): the channel could not
# connect, so no server saw the call. tests/client/test_reconnect.py checks them against
# a real channel.
NEVER_CONNECTED = ("failed to connect to all addresses", "connections to all backends failing")


def never_connected(e: grpc.RpcError) -> bool:
    """Whether the call failed because its channel could not connect to any server (so
    none saw it), rather than being refused or dropped by one."""
    if e.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = e.details() or ""
    return details.startswith(NEVER_CONNECTED)


def error_from_rpc(e: grpc.RpcError) -> RadixMeshError:
    """A typed exception (the catalogue's) carrying the status name and message.

    RESOURCE_EXHAUSTED is `Overloaded` when a server said so (its retry-after metadata);
    without it gRPC itself refused a message over its size limit: an InvalidArgument, as
    no other server would take it either. A CANCELLED the server side made is
    `Unavailable`: the server went away. An UNAVAILABLE's retry-after metadata (the router
    sends it when it has no worker for the request) is its `retry_after`."""
    code: grpc.StatusCode = e.code()
    details: str = e.details() or code.name
    metadata = dict(e.trailing_metadata() or ())
    if _dropped_by_server(e):
        return error_from_status("UNAVAILABLE", f"the server dropped the call: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        after = metadata.get(OVERLOADED_METADATA_KEY)
        if after is None:
            return error_from_status("INVALID_ARGUMENT", f"the message is too large: {details}")
        error = error_from_status(code.name, details)
        if isinstance(error, Overloaded):
            error.retry_after = _seconds(after)
        return error
    error = error_from_status(code.name, details, metadata.get(FIELD_METADATA_KEY))
    after = metadata.get(OVERLOADED_METADATA_KEY)
    if isinstance(error, Unavailable) and after is not None:
        error.retry_after = _seconds(after)
    return error


def is_overloaded(e: grpc.RpcError) -> bool:
    """Whether a server refused the call for load (another may take it), not for size."""
    if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return False
    return any(k == OVERLOADED_METADATA_KEY for k, _ in e.trailing_metadata() or ())


RETRY_AFTER_KEYS = ("retry-after", OVERLOADED_METADATA_KEY)


def server_retry_after(e: grpc.RpcError) -> float | None:
    """The seconds the server asked the client to wait (trailing metadata `retry-after`,
    or ours, `radixmesh-retry-after`); None when it said nothing readable."""
    for key, value in e.trailing_metadata() or ():
        if key in RETRY_AFTER_KEYS:
            seconds = parse_retry_after(value)
            if seconds is not None:
                return seconds
    return None


def parse_retry_after(value: str | bytes, now: float | None = None) -> float | None:
    """An HTTP Retry-After value (RFC 9110: delay-seconds, or an HTTP date, seconds from
    `now`, default the wall clock) as seconds >= 0; None when it is neither."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _seconds(text: str | bytes) -> float:
    try:
        return max(float(text), 0.0)
    except ValueError:
        return 1.0
