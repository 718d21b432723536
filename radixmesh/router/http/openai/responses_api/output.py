"""Worker chunks -> a Responses reply: the whole `response`, or its semantic events.

One `ResponseReply` per request takes the worker's chunks in order; each yields the SSE
events it lets out, and updates the `output` those events describe, so a streamed and a
whole reply agree (the blocks come from openai/blocks.py, as Anthropic's do):

- text -> a `message` item with one `output_text` part: `response.output_item.added`,
  `response.content_part.added`, `response.output_text.delta`..., then `.done` events;
- a call -> a `function_call` item (`call_id` for the client's `function_call_output`):
  added, its whole arguments as one `response.function_call_arguments.delta` (calls are
  released whole by the tool-call splitter), `.done`;
- the stream opens with `response.created` and `response.in_progress` (once the first
  chunk came: errors until then get their own HTTP status) and ends with
  `response.completed`, or `response.incomplete` (`incomplete_details.reason:
  "max_output_tokens"`) when the output ran out of tokens. Every event has a
  `sequence_number`, from 0.
- `usage`: `input_tokens` is the whole prompt, `input_tokens_details.cached_tokens` the
  part the worker served from its radix cache.
- logprobs (asked for: convert.py): each token's entry is the chat completion's (`token`,
  `logprob`, `bytes`, `top_logprobs`), in the `output_text` part; a delta event carries
  its tokens (without `bytes`, as OpenAI's events do). The text comes out of `Blocks`
  later than its tokens (leading whitespace is held): tokens wait until a delta goes out,
  and those after the last delta (an end-of-text token) are the part's and the `.done`
  event's only. Without logprobs the lists are empty.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from radixmesh.errors import Unavailable
from radixmesh.router.http.event_ids import derived_id
from radixmesh.router.http.openai.blocks import Blocks, Call, Event, TextDelta
from radixmesh.router.http.openai.convert import Generation
from radixmesh.router.http.openai.message import MessageStream
from radixmesh.router.http.openai.reply import chat_logprobs
from radixmesh.router.http.openai.responses_api import requests as rq
from radixmesh.tokenizer import TokenizerLike
from radixmesh.v1 import common_pb2

SseEvent = tuple[str, dict[str, Any]]


def response_id() -> str:
    return "resp_" + uuid.uuid4().hex


def echoed(req: rq.ResponsesRequest) -> dict[str, Any]:
    """The request's settings as a response repeats them."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "store": req.store is not False,
        "background": False,
        "temperature": req.temperature,
        "text": {
            "format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
        },
        "tool_choice": (
            req.tool_choice.model_dump()
            if isinstance(req.tool_choice, rq.NamedFunction)
            else req.tool_choice or "auto"
        ),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "top_logprobs": req.top_logprobs,
        "top_p": req.top_p,
        "truncation": req.truncation or "disabled",
    }


class ResponseReply:
    def __init__(
        self, gen: Generation, rid: str, settings: dict[str, Any], tokenizer: TokenizerLike
    ) -> None:
        self.gen = gen
        self.rid = rid
        self.settings = settings
        self.tokenizer = tokenizer
        self.created = int(time.time())
        self.blocks = Blocks(MessageStream.of(gen))
        self.output: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.usage: dict[str, Any] | None = None
        self.sequence = 0
        self._tokens: list[dict[str, Any]] = []  # logprobs of tokens whose text is not out yet

    def response(self) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if self.status == "incomplete" else None
        return {
            "id": self.rid,
            "object": "response",
            "created_at": self.created,
            "status": self.status,
            "error": None,
            "incomplete_details": incomplete,
            "model": self.gen.model,
            # A snapshot: an event's response must not change as the output goes on
            # (a resumable stream builds a chunk's events before it sends the first).
            "output": [_copy(item) for item in self.output],
            **self.settings,
            "usage": self.usage,
        }

    # ---- chunk by chunk -----------------------------------------------------------------

    def _event(self, kind: str, /, **fields: Any) -> SseEvent:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return kind, payload

    def opening(self, first: common_pb2.GenerateChunk | None = None) -> list[SseEvent]:
        """`response.created` and `response.in_progress` (`first`: the chunk they open
        the stream with, which they do not depend on)."""
        return [
            self._event("response.created", response=self.response()),
            self._event("response.in_progress", response=self.response()),
        ]

    def renumber(self, sent: int) -> None:
        """The next event's `sequence_number` is `sent` (a resume skipped those before)."""
        self.sequence = sent

    def of(self, chunk: common_pb2.GenerateChunk) -> list[SseEvent]:
        """The events of the next chunk; the last one (with `finish`) ends the response."""
        last = chunk.HasField("finish")
        if last:
            if chunk.finish.reason == common_pb2.FINISH_REASON_ABORT:
                why = chunk.finish.message or "no reason given"
                raise Unavailable(f"the worker aborted the request: {why}")
            cut = chunk.finish.reason == common_pb2.FINISH_REASON_LENGTH
            self.status = "incomplete" if cut else "completed"
        if self.gen.top_logprobs is not None:
            self._tokens += [lp.model_dump() for lp in chat_logprobs(chunk, self.tokenizer)]
        out: list[SseEvent] = []
        for event in self.blocks.feed(chunk.text, last):
            out += self._block_events(event)
        if last:
            self.usage = {
                "input_tokens": chunk.prompt_tokens,
                "input_tokens_details": {
                    "cached_tokens": chunk.cached_tokens,
                    "cache_write_tokens": 0,
                },
                "output_tokens": chunk.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": chunk.prompt_tokens + chunk.completion_tokens,
            }
            out.append(self._event(f"response.{self.status}", response=self.response()))
        return out

    @property
    def _item_status(self) -> str:
        return "incomplete" if self.status == "incomplete" else "completed"

    def _block_events(self, event: Event) -> list[SseEvent]:
        if isinstance(event, Call):
            return self._call_events(event)
        if isinstance(event, TextDelta):
            return self._text_events(event)
        item = self.output[event.block]
        item["status"] = self._item_status
        part = item["content"][0]
        part["logprobs"] += self._take_tokens()
        where = {"item_id": item["id"], "output_index": event.block, "content_index": 0}
        lps = _event_logprobs(part["logprobs"])
        return [
            self._event("response.output_text.done", **where, text=event.text, logprobs=lps),
            self._event("response.content_part.done", **where, part=dict(part)),
            self._event("response.output_item.done", output_index=event.block, item=_copy(item)),
        ]

    def _take_tokens(self) -> list[dict[str, Any]]:
        tokens, self._tokens = self._tokens, []
        return tokens

    def _text_events(self, event: TextDelta) -> list[SseEvent]:
        index, out = event.block, []
        if event.first:  # a new message item, its one part
            item: dict[str, Any] = {
                # Named after the response and its place: a resumed stream's are the same.
                "id": "msg_" + derived_id(self.rid, f"output/{index}"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            self.output.append(item)
            added = self._event("response.output_item.added", output_index=index, item=_copy(item))
            item["content"] = [_part("")]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out = [added, self._event("response.content_part.added", **where, part=_part(""))]
        item = self.output[index]
        item["content"][0]["text"] += event.text
        if event.text:
            tokens = self._take_tokens()
            item["content"][0]["logprobs"] += tokens
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            lps = _event_logprobs(tokens)
            delta = self._event(
                "response.output_text.delta", **where, delta=event.text, logprobs=lps
            )
            out.append(delta)
        return out

    def _call_events(self, call: Call) -> list[SseEvent]:
        item = {
            "id": "fc_" + uuid.uuid4().hex,
            "type": "function_call",
            "status": "in_progress",
            "call_id": "call_" + uuid.uuid4().hex[:24],
            "name": call.name,
            "arguments": "",
        }
        self.output.append(item)
        index = call.block
        added = self._event("response.output_item.added", output_index=index, item=_copy(item))
        item |= {"arguments": call.arguments, "status": self._item_status}
        where = {"item_id": item["id"], "output_index": index}
        return [
            added,
            self._event("response.function_call_arguments.delta", **where, delta=call.arguments),
            self._event(
                "response.function_call_arguments.done",
                **where,
                name=call.name,
                arguments=call.arguments,
            ),
            self._event("response.output_item.done", output_index=index, item=_copy(item)),
        ]


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _event_logprobs(tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tokens' logprobs as the text events carry them: without `bytes`."""
    return [
        {
            "token": t["token"],
            "logprob": t["logprob"],
            "top_logprobs": [
                {"token": a["token"], "logprob": a["logprob"]} for a in t["top_logprobs"]
            ],
        }
        for t in tokens
    ]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """A snapshot of an item as an event carries it (the item goes on changing)."""
    if "content" not in item:
        return dict(item)
    parts = [p | {"logprobs": list(p["logprobs"])} for p in item["content"]]
    return item | {"content": parts}
