"""A chat reply as the agents' APIs lay it out: a sequence of blocks, text runs and tool calls.

Anthropic's Messages API (content blocks) and OpenAI's Responses API (output items) both
reply with a list: some text, a call, perhaps more text. `Blocks` turns a choice's text,
piece by piece, into that list's events, over the same `MessageStream` (message.py) and
tool-call parsers chat completions use; each API writes the events in its own layout, and
builds its whole (non-streamed) reply from the same events, so both ways agree.

Decisions:
- A call arrives whole (the splitter releases it once complete): it is one event, which
  the APIs send as a start, the whole arguments as one delta, and a stop.
- Whitespace outside a text block (the newlines between `<tool_call>` blocks) opens no
  block: it is held, dropped when a call follows, and kept only when the reply has no
  call (a reply of only whitespace is still a text block).
- A reply with nothing in it is one empty text block (both APIs' clients expect one).
- Within one piece of text the splitter returns the text and the calls apart: the text
  goes first. A non-streamed reply is one piece, so its text comes before its calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixmesh.router.http.openai.message import MessageStream


@dataclass(frozen=True)
class TextDelta:
    block: int  # the block's position in the reply
    text: str
    first: bool  # this delta opens the block


@dataclass(frozen=True)
class TextEnd:
    block: int
    text: str  # the block's whole text


@dataclass(frozen=True)
class Call:
    block: int
    name: str
    arguments: str  # JSON text


Event = TextDelta | TextEnd | Call


class Blocks:
    """One choice's reply, fed text as it comes; `stream` None: the text is plain."""

    def __init__(self, stream: MessageStream | None) -> None:
        self.stream = stream
        self.count = 0  # blocks opened so far
        self.calls = 0
        self._open: int | None = None  # the text block being written
        self._text = ""  # its text so far
        self._held = ""  # whitespace outside a block

    def feed(self, text: str, last: bool) -> list[Event]:
        """The events `text` (the next piece of the reply) lets out; `last`: the reply's end."""
        if self.stream is None:
            content, calls = text, []
        else:
            part = self.stream.step(text, last)
            content, calls = (
                part.content,
                [(c.function.name, c.function.arguments) for c in part.calls],
            )
        events: list[Event] = []
        if content:
            self._add_text(content, events)
        for name, arguments in calls:
            self._close(events)
            self._held = ""
            events.append(Call(self.count, name, arguments))
            self.count += 1
            self.calls += 1
        if last:
            if self.count == 0:  # only whitespace, or nothing: one text block all the same
                self._open_with(self._held, events)
            self._held = ""
            self._close(events)
        return events

    def _add_text(self, text: str, events: list[Event]) -> None:
        if self._open is not None:
            self._text += text
            events.append(TextDelta(self._open, text, first=False))
            return
        self._held += text
        if self._held.strip():
            self._open_with(self._held, events)
            self._held = ""

    def _open_with(self, text: str, events: list[Event]) -> None:
        self._open, self._text = self.count, text
        self.count += 1
        events.append(TextDelta(self._open, text, first=True))

    def _close(self, events: list[Event]) -> None:
        if self._open is not None:
            events.append(TextEnd(self._open, self._text))
            self._open, self._text = None, ""
