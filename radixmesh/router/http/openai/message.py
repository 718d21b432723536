"""A chat choice's reply text -> its message parts: reasoning, content and tool calls.

Text goes through the reasoning splitter (when asked), then the tool-call splitter (when
the request has tools to parse); each step of a stream yields what can go out now, and
`finish` the rest. Calls get their OpenAI ids here, numbered in order per choice.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from radixmesh.router.http.openai import responses as rs
from radixmesh.router.http.openai.convert import Generation
from radixmesh.router.http.openai.reasoning import ReasoningSplitter
from radixmesh.router.http.openai.tool_parsers import ParsedCall, ToolCallParser, ToolCallSplitter


@dataclass
class MessagePart:
    content: str = ""
    reasoning: str = ""
    calls: list[rs.ToolCall] = field(default_factory=list)
    first_call: int = 0  # the index (within the choice) of calls[0]

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.calls)


class MessageStream:
    def __init__(self, parser: ToolCallParser | None, reasoning: ReasoningSplitter | None) -> None:
        self.tools = ToolCallSplitter(parser) if parser is not None else None
        self.reasoning = reasoning
        self.num_calls = 0

    @classmethod
    def of(cls, gen: Generation) -> MessageStream | None:
        """The stream for a choice of `gen`; None when its text is plain content."""
        plan, tail = gen.tool_plan, gen.reasoning_tail
        parser = plan.parser if plan is not None else None
        if parser is None and tail is None:
            return None
        return cls(parser, ReasoningSplitter.after_prompt(tail) if tail is not None else None)

    def step(self, text: str, last: bool) -> MessagePart:
        """What `text` (the next piece of the reply) lets out; everything when `last`."""
        if self.reasoning is not None:
            thought, content = self.reasoning.feed(text)
            if last:
                more_thought, more = self.reasoning.finish()
                thought, content = thought + more_thought, content + more
        else:
            thought, content = "", text
        return self._part(thought, *self._split(content, last))

    def _split(self, text: str, last: bool) -> tuple[str, list[ParsedCall]]:
        if self.tools is None:
            return text, []
        content, calls = self.tools.feed(text) if text else ("", [])
        if last:
            rest, more = self.tools.finish()
            content, calls = content + rest, calls + more
        return content, calls

    def _part(self, thought: str, content: str, calls: list[ParsedCall]) -> MessagePart:
        part = MessagePart(content, thought, first_call=self.num_calls)
        for c in calls:
            function = rs.FunctionCall(name=c.name, arguments=c.arguments)
            part.calls.append(rs.ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=function))
        self.num_calls += len(calls)
        return part


@dataclass
class Message:
    """A whole message, gathered from its parts."""

    content: str = ""
    reasoning: str = ""
    calls: list[rs.ToolCall] = field(default_factory=list)

    def add(self, part: MessagePart) -> None:
        self.content += part.content
        self.reasoning += part.reasoning
        self.calls += part.calls

    def finish_reason(self, reason: rs.FinishReason | None) -> rs.FinishReason | None:
        """OpenAI's reason: a reply that called tools and stopped ends with `tool_calls`."""
        return "tool_calls" if self.calls and reason == "stop" else reason

    def reply(self, separate_reasoning: bool) -> rs.ChatMessage:
        # A reply that only calls tools has no content (whitespace around the calls aside).
        content = None if self.calls and not self.content.strip() else self.content
        msg = rs.ChatMessage(content=content)
        if self.calls:
            msg.tool_calls = self.calls
        if separate_reasoning:
            msg.reasoning_content = self.reasoning or None
        return msg
