"""Reasoning text: a reply's leading `<think>...</think>` block, split off as it streams.

With `separate_reasoning`, what a reasoning model writes inside the block becomes the
message's `reasoning_content` and the rest its `content`. A block opened by the chat
template (the prompt ends with `<think>`) starts the reply in reasoning. A reply that does
not start with the block is all content; a block that never closes is all reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixmesh.router.http.openai.tool_parsers import partial_suffix

OPEN, CLOSE = "<think>", "</think>"


@dataclass
class ReasoningSplitter:
    state: str = "start"  # start (before any text), think, content
    buf: str = ""
    trim: bool = False  # strip the newlines that follow </think>

    @classmethod
    def after_prompt(cls, prompt_tail: str) -> ReasoningSplitter:
        """A splitter for a reply whose prompt ends with `prompt_tail`."""
        return cls(state="think" if prompt_tail.rstrip().endswith(OPEN) else "start")

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) that can go out now."""
        self.buf += text
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, str]:
        reasoning = ""
        if self.state == "start":
            rest = self.buf.lstrip()
            if rest.startswith(OPEN):
                self.buf, self.state = rest[len(OPEN) :], "think"
            elif OPEN.startswith(rest) and not final:
                return "", ""  # may still become `<think>`
            else:
                self.state = "content"
        if self.state == "think":
            end = self.buf.find(CLOSE)
            if end < 0:
                keep = 0 if final else partial_suffix(self.buf, CLOSE)
                reasoning, self.buf = (
                    self.buf[: len(self.buf) - keep],
                    self.buf[len(self.buf) - keep :],
                )
                return reasoning, ""
            reasoning, self.buf = self.buf[:end], self.buf[end + len(CLOSE) :]
            self.state, self.trim = "content", True
        content, self.buf = self.buf, ""
        if self.trim:
            content = content.lstrip()
            self.trim = not content
        return reasoning, content
