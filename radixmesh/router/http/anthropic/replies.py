"""Worker chunks -> Anthropic's reply: the whole `message`, or its stream of events.

One `MessageReply` per request takes the worker's chunks in order; each chunk yields the
SSE events it lets out (`content_block_start` / `_delta` / `_stop`, from openai/blocks.py)
and updates the message those events describe, so a streamed and a whole reply agree.

- `message_start` carries the prompt's usage, known from the first chunk (a stream opens
  once the first chunk came); `message_delta` the stop reason and the final usage.
- `usage`: `input_tokens` are the prompt tokens the worker computed, `cache_read_input_
  tokens` those it served from its radix cache (the worker's `cached_tokens`), so their
  sum is the prompt, as in Anthropic's accounting; `cache_creation_input_tokens` is 0
  (the radix cache keeps prefixes without being asked, and writing them costs nothing).
- `stop_reason`: `tool_use` when the reply called a tool and stopped, `stop_sequence`
  (with `stop_sequence`) when one of the request's stop sequences ended it, `max_tokens`
  when it ran out, else `end_turn`. `max_tokens` wins over `tool_use`: a reply cut in a
  call keeps the calls complete before it as `tool_use` blocks and drops the half call
  (no markup reaches a text block; openai/tool_parsers.py), and the stop reason says the
  reply was cut.
- A call's arguments go out as one `input_json_delta` with the whole JSON: calls are
  released whole by the tool-call splitter.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from radixmesh.errors import Unavailable
from radixmesh.router.http.openai.blocks import Blocks, Call, Event, TextDelta, TextEnd
from radixmesh.router.http.openai.convert import Generation
from radixmesh.router.http.openai.message import MessageStream
from radixmesh.v1 import common_pb2

SseEvent = tuple[str, dict[str, Any]]


def message_id() -> str:
    return "msg_" + uuid.uuid4().hex


class MessageReply:
    def __init__(self, gen: Generation, rid: str) -> None:
        self.gen = gen
        self.rid = rid
        self.blocks = Blocks(MessageStream.of(gen))
        self.content: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.output_tokens = 0

    # ---- the whole message --------------------------------------------------------------

    def usage(self) -> dict[str, Any]:
        return {
            "input_tokens": self.prompt_tokens - self.cached_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cached_tokens,
        }

    def message(self) -> dict[str, Any]:
        return {
            "id": self.rid,
            "type": "message",
            "role": "assistant",
            "content": self.content,
            "model": self.gen.model,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": self.usage(),
        }

    # ---- chunk by chunk -----------------------------------------------------------------

    def opening(self, first: common_pb2.GenerateChunk) -> list[SseEvent]:
        """`message_start` (with the prompt's usage, from the first chunk) and a `ping`."""
        self._count(first)
        start = self.message() | {"content": [], "stop_reason": None, "stop_sequence": None}
        start["usage"] = self.usage() | {"output_tokens": 0}
        return [
            ("message_start", {"type": "message_start", "message": start}),
            ("ping", {"type": "ping"}),
        ]

    def renumber(self, sent: int) -> None:
        """Anthropic's events carry no sequence number: nothing to carry on."""

    def of(self, chunk: common_pb2.GenerateChunk) -> list[SseEvent]:
        """The events of the next chunk; the last one (with `finish`) ends the message."""
        self._count(chunk)
        last = chunk.HasField("finish")
        out: list[SseEvent] = []
        for event in self.blocks.feed(chunk.text, last):
            out += self._block_events(event)
        if last:
            self._finish(chunk.finish)
            delta = {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence}
            out.append(
                ("message_delta", {"type": "message_delta", "delta": delta, "usage": self.usage()})
            )
            out.append(("message_stop", {"type": "message_stop"}))
        return out

    def _count(self, chunk: common_pb2.GenerateChunk) -> None:
        # Counts are cumulative; the prompt's are set from the first chunk on.
        self.prompt_tokens = chunk.prompt_tokens or self.prompt_tokens
        self.cached_tokens = chunk.cached_tokens or self.cached_tokens
        self.output_tokens = chunk.completion_tokens

    def _block_events(self, event: Event) -> list[SseEvent]:
        if isinstance(event, TextDelta):
            out: list[SseEvent] = []
            if event.first:
                self.content.append({"type": "text", "text": ""})
                start = {
                    "type": "content_block_start",
                    "index": event.block,
                    "content_block": {"type": "text", "text": ""},
                }
                out.append(("content_block_start", start))
            self.content[event.block]["text"] += event.text
            if event.text:
                delta = {"type": "text_delta", "text": event.text}
                out.append(
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": event.block, "delta": delta},
                    )
                )
            return out
        if isinstance(event, TextEnd):
            return [("content_block_stop", {"type": "content_block_stop", "index": event.block})]
        return self._call_events(event)

    def _call_events(self, call: Call) -> list[SseEvent]:
        block = {
            "type": "tool_use",
            "id": "toolu_" + uuid.uuid4().hex[:24],
            "name": call.name,
            "input": json.loads(call.arguments),
        }
        self.content.append(block)
        delta = {"type": "input_json_delta", "partial_json": call.arguments}
        return [
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": call.block,
                    "content_block": block | {"input": {}},
                },
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": call.block, "delta": delta},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": call.block}),
        ]

    def _finish(self, finish: common_pb2.Finish) -> None:
        if finish.reason == common_pb2.FINISH_REASON_ABORT:
            raise Unavailable(
                f"the worker aborted the request: {finish.message or 'no reason given'}"
            )
        if finish.reason == common_pb2.FINISH_REASON_LENGTH:
            self.stop_reason = "max_tokens"
        elif self.blocks.calls:
            self.stop_reason = "tool_use"
        elif finish.WhichOneof("matched") == "matched_text":
            self.stop_reason, self.stop_sequence = "stop_sequence", finish.matched_text
        else:
            self.stop_reason = "end_turn"
