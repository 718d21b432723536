"""Resuming a stream whose router went away: the SDK's side of resumable streams.

A router's streamed messages carry the stream's id and the completion tokens delivered
so far (its offset). When the call then breaks because the server went away
(UNAVAILABLE, or a CANCELLED the server side made), the client asks any router to
`Resume` from that offset: the worker holding the request sends what came after, so the
caller sees every token once. A stream no worker holds any more (its worker died, or the
grace passed) raises Unavailable naming both; `resume` by hand, NotFound. A stream that
is not resumed (the client's `max_retries` or deadline spent) raises Unavailable naming
its stream id and offset, for a `resume` by hand; a router killed mid-stream reaches the
client as a transport error (the process could send no status), never raised as such.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc

from radixmesh.errors import (
    OVERLOADED_METADATA_KEY,
    RESUME_METADATA_KEY,
    NotFound,
    RadixMeshError,
    Unavailable,
)

from . import convert
from .types import Chunk


def _resumable_failure(e: grpc.RpcError) -> bool:
    """A failure the stream survives: the router went away (no status of its own, only
    the transport's) or said to resume (it shuts down). A router's own UNAVAILABLE for a
    worker that died or stalled (it names a retry-after) ends the stream."""
    metadata = dict(e.trailing_metadata() or ())
    return RESUME_METADATA_KEY in metadata or OVERLOADED_METADATA_KEY not in metadata


class ResumableStream:
    """One client stream's resume point, read from each message it gets."""

    def __init__(self, resume_at: tuple[str, int] | None = None) -> None:
        self.resume_at = resume_at  # (stream id, offset) once a router sent one
        self.got_token = False
        self.finished = False  # the last chunk (its finish) came
        self._request_id: str | None = None  # the first message's: the caller's id
        self._broke: grpc.RpcError | None = None  # how the stream last broke

    def chunk(self, resp: Any) -> Chunk:
        """A message as a Chunk, under the stream's first request id, with its resume
        point."""
        chunk = convert.chunk_from_proto(resp.chunk, convert.served_by(resp))
        if self._request_id is None:
            self._request_id = chunk.request_id
        stream_id = str(getattr(resp, "stream_id", ""))
        if stream_id:
            offset = int(resp.offset)
            self.resume_at = (stream_id, offset)
            chunk = dataclasses.replace(
                chunk, request_id=self._request_id, stream_id=stream_id, offset=offset
            )
        self.got_token = self.got_token or bool(chunk.token_ids)
        self.finished = chunk.finish_reason is not None
        return chunk

    def may_retry(self, e: grpc.RpcError) -> bool:
        """Whether the call may be tried again (within the client's retry budget): before
        the first token as any call; after it only by resuming, when the server went away."""
        if self.resume_at is not None:
            if convert.server_went_away(e) and _resumable_failure(e):
                self._broke = e
                return True
            return False
        return not self.got_token

    def error(self, e: grpc.RpcError) -> RadixMeshError:
        """The error to raise for a failed call. A stream that broke and then could not be
        resumed (its worker died, or the grace passed) raises Unavailable, as a broken
        stream did before it could resume, saying both; one whose router went away and
        that was not resumed (no retry left, or the deadline) raises Unavailable saying
        where to resume it, never the transport's error."""
        if self.resume_at is not None and convert.server_went_away(e) and _resumable_failure(e):
            stream_id, offset = self.resume_at
            cut = Unavailable(
                f"the stream {stream_id!r} broke after {offset} tokens: its router went "
                f"away ({e.details() or e.code().name}), and no retry or time was left to "
                f"resume it; resume({stream_id!r}, {offset}) continues it while its worker "
                "holds it (the worker's grace period)"
            )
            cut.grpc_status = "UNAVAILABLE"
            return cut
        error = convert.error_from_rpc(e)
        if isinstance(error, NotFound) and self._broke is not None and self.resume_at:
            stream_id, offset = self.resume_at
            lost = Unavailable(
                f"the stream {stream_id!r} broke after {offset} tokens "
                f"({self._broke.details()}) and could not be resumed: {error}"
            )
            lost.grpc_status = "UNAVAILABLE"
            return lost
        return error
