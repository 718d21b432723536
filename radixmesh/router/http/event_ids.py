"""Resumable named-event streams: Anthropic's Messages and OpenAI's Responses SSE events
with ids, and the resume of one after the id a client last got.

A plain chat completion's events each carry one chunk's text alone, so its resume
continues at a token offset (openai/generation.py). These APIs' events do not: a chunk
opens blocks (`content_block_start`, `response.output_item.added`), the last one closes
them with the whole text (`response.output_text.done`, `response.completed`), and one
chunk lets out several events. (A chat completion whose text a parser splits, tools or
reasoning, is alike: a delta depends on the text before it; generation.py resumes it
here too.) A resume therefore replays the stream from the worker's first output
(worker/resumable.py keeps it all) through a fresh reply, drops the events the client
has, and sends the rest: the client gets exactly the events after its id, with the ids,
sequence numbers and `created_at` it already saw.

An event's id is "<stream id>/<created>/<fed>/<into>/<sent>":
- `fed`: how much of the stream the client has all the events of, counted as one for the
  opening events (`message_start`, `response.created`), one for each character of the
  worker's text and one for its finish: the replay feeds the reply that much without
  sending a thing;
- `into`: the events the client has of those the following text lets out (a connection
  cut between two events of one chunk): the replay drops that many more;
- `sent`: the events the client has in all (Responses' `sequence_number` goes on from it);
- `created`: the reply's creation time (Responses' `created_at`).

Character offsets, not token offsets: the replay's chunks are joined as the worker and
router find them, never split as the first stream's were, and a joined chunk's text is
cut at any character, where a token offset falls inside one. Only a plain-text reply
resumes (no tools, reasoning or logprobs: `generation.resumable`): its events are a
function of the text so far whatever the chunking, and within one chunk's events the
text is in one delta, so the events the client has of a chunk are a prefix of those a
longer chunk lets out. (A tool-call parser lets out a piece's text before its calls: its
blocks would be numbered otherwise after a replay, so such streams do not resume. A chat
delta has no blocks, its content, reasoning and calls are apart, and the parsers let out
the same of the same text however it is chunked: tests/router/http/test_event_ids.py.)
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from radixmesh.errors import InvalidArgument
from radixmesh.router.dispatch import StreamRef
from radixmesh.router.http.openai.convert import Generation
from radixmesh.router.http.openai.message import MessageStream
from radixmesh.v1 import common_pb2

SseEvent = tuple[str, dict[str, Any]]


class EventReply(Protocol):
    """A reply built chunk by chunk (anthropic/replies.py, responses_api/output.py)."""

    def opening(self, first: common_pb2.GenerateChunk) -> list[SseEvent]: ...

    def of(self, chunk: common_pb2.GenerateChunk) -> list[SseEvent]: ...

    def renumber(self, sent: int) -> None:
        """The next event is the reply's `sent`-th (a resume skipped those before)."""


@dataclass(frozen=True)
class EventId:
    stream_id: str
    created: int
    fed: int
    into: int
    sent: int

    def __str__(self) -> str:
        return f"{self.stream_id}/{self.created}/{self.fed}/{self.into}/{self.sent}"

    @classmethod
    def parse(cls, value: str) -> EventId:
        """The id a `Last-Event-ID` names; InvalidArgument naming the header."""
        parts = value.rsplit("/", 4)
        numbers = parts[1:]
        if len(parts) != 5 or not all(n.isdigit() and len(n) <= 12 for n in numbers):
            raise InvalidArgument("Last-Event-ID", f"not an event id of this API: {value[:160]!r}")
        StreamRef.parse(parts[0], "Last-Event-ID")
        created, fed, into, sent = (int(n) for n in numbers)
        if into > sent:
            raise InvalidArgument("Last-Event-ID", f"not an event id of this API: {value[:160]!r}")
        return cls(parts[0], created, fed, into, sent)


def resumable(gen: Generation) -> bool:
    """Whether `gen`'s stream resumes: plain text (module docstring)."""
    return (
        gen.stream
        and gen.num_choices == 1
        and gen.top_logprobs is None
        and MessageStream.of(gen) is None
    )


def resumption(
    gen: Generation, last_event_id: str | None
) -> tuple[StreamRef | None, EventId | None]:
    """A stream's `StreamRef` when it resumes (None: it does not), and the id it resumes
    after (`Last-Event-ID`); InvalidArgument for that header on a stream that cannot."""
    if not resumable(gen):
        if last_event_id is not None and gen.stream:
            raise InvalidArgument(
                "Last-Event-ID",
                "only a stream of plain text resumes (not one with tools to parse, "
                "reasoning to separate or logprobs)",
            )
        return None, None
    if last_event_id is None:
        return StreamRef(), None
    after = EventId.parse(last_event_id)
    return StreamRef.resumed(after.stream_id, "Last-Event-ID"), after


def derived_id(name: str, what: str, n: int = 32) -> str:
    """`n` hex digits named after a stream (its id, or its worker request id, known before
    its worker): an id every replica gives the same thing of the same stream (a reply's
    message, response and item ids, which a resume repeats)."""
    return hashlib.sha256(f"{name}#{what}".encode()).hexdigest()[:n]


class IdentifiedEvents:
    """A reply's events, chunk by chunk, with their ids (none when `ref` is None: a stream
    that does not resume); resuming `after` an id, only the events the client lacks."""

    def __init__(
        self,
        reply: EventReply,
        ref: StreamRef | None,
        after: EventId | None = None,
        created: int | None = None,
    ) -> None:
        self.reply = reply
        self.ref = ref
        self.after = after
        # The reply's creation time (`created`: its own), as the client first saw it.
        now = int(time.time()) if created is None else created
        self.created = after.created if after is not None else now
        self.fed = 0  # characters (and the finish) of the worker's text fed to the reply
        self.sent = after.sent if after is not None else 0
        self.skip = 0  # events of the replay the client has, still to drop
        self.first = True
        if after is not None and after.fed == 0:
            self._caught_up(after)

    def of(self, chunk: common_pb2.GenerateChunk) -> list[tuple[SseEvent, str | None]]:
        """The events of the next chunk the client lacks, with their ids."""
        after = self.after
        if after is not None:  # replaying what the client has
            size = self.first + _size(chunk)
            if self.fed + size <= after.fed:
                self._mute(chunk)
                if self.fed == after.fed:
                    self._caught_up(after)
                return []
            head, chunk = _split(chunk, after.fed - self.fed - self.first)
            self._mute(head)
            self._caught_up(after)
        before = self.fed
        return list(self._identified(self._events(chunk), before))

    def _events(self, chunk: common_pb2.GenerateChunk) -> list[SseEvent]:
        events = self.reply.opening(chunk) if self.first else []
        self.fed += self.first + _size(chunk)
        self.first = False
        return events + self.reply.of(chunk)

    def _mute(self, chunk: common_pb2.GenerateChunk) -> None:
        self._events(chunk)

    def _caught_up(self, after: EventId) -> None:
        self.after = None
        self.skip = after.into
        self.reply.renumber(after.sent - after.into)

    def _identified(
        self, events: list[SseEvent], before: int
    ) -> Iterator[tuple[SseEvent, str | None]]:
        """`events` (those of the text after `before`) but the ones the client has."""
        last = len(events) - 1
        for i, event in enumerate(events):
            if self.skip:
                self.skip -= 1
                continue
            self.sent += 1
            yield event, self._id(before, i, last)

    def _id(self, before: int, i: int, last: int) -> str | None:
        if self.ref is None:
            return None
        fed, into = (self.fed, 0) if i == last else (before, i + 1)
        return str(EventId(self.ref.stream_id, self.created, fed, into, self.sent))


def _size(chunk: common_pb2.GenerateChunk) -> int:
    return len(chunk.text) + chunk.HasField("finish")


def _split(
    chunk: common_pb2.GenerateChunk, at: int
) -> tuple[common_pb2.GenerateChunk, common_pb2.GenerateChunk]:
    """`chunk` as two: its first `at` characters (no finish), and the rest."""
    head, tail = common_pb2.GenerateChunk(), common_pb2.GenerateChunk()
    head.CopyFrom(chunk)
    tail.CopyFrom(chunk)
    head.text, tail.text = chunk.text[:at], chunk.text[at:]
    head.ClearField("finish")
    return head, tail
