"""Tool calls in a model's output: one parser per syntax, and the incremental splitter.

The syntaxes (`PARSERS`):

- `hermes`: `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`, one block per
  call (Hermes, Qwen 2.5 / 3, and radixmesh's own rendering for templates without a tool
  section, see tools.py);
- `llama3`: the whole reply is `{"name": "f", "parameters": {...}}` (after an optional
  `<|python_tag|>`), several calls separated by `;`;
- `mistral`: `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`.

`ToolCallSplitter` feeds text through a parser as it streams: text that cannot start a
call goes out as content at once, text that might (a partial `<tool_c`) waits, and each
call comes out whole when it is complete.

Tool-call markup never reaches content. Decisions:
- Markup that holds no call is dropped, with the whitespace after it: a block cut off by
  the end of the reply (`max_tokens` in the middle of a call; the finish reason says so),
  a block whose JSON does not parse or names no function, a partial start marker left
  at the end. An agent reading content would take any of them for prose.
- llama3 calls have no marker: JSON at the start of the reply that is no call is the
  model's answer, content; an object cut off at the end is dropped when it opens like a
  call (`{"name": ...`), else content.
- An identical call (same name, same arguments as JSON values) already made in the reply
  is dropped: a reply's calls run together, so a copy asks for the same result twice,
  and a model repeating its own call is the usual cause. No request field asks for
  copies; a client that wants a call run again asks in its next turn.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as OpenAI's `function.arguments`


@dataclass(frozen=True)
class Taken:
    """What a parser took from the start of the text: `consumed` characters, and the calls
    in them; `valid` False means they are no call (nor markup), the caller keeps them as
    content. Valid characters beyond the calls' are markup, dropped."""

    calls: list[ParsedCall]
    consumed: int
    valid: bool = True


class ToolCallParser(ABC):
    name: ClassVar[str]

    @abstractmethod
    def find_start(self, text: str, at_start: bool) -> int:
        """Where a call may start in `text` (-1: nowhere). `at_start`: nothing but
        whitespace came before `text` in the reply."""

    @abstractmethod
    def held(self, text: str, at_start: bool) -> int:
        """How many characters at the end of `text` (which has no start) might begin one."""

    @abstractmethod
    def take(self, text: str, final: bool) -> Taken | None:
        """Calls at the start of `text` (a start found by `find_start`); None while they
        are incomplete and more text may come (never when `final`)."""


def partial_suffix(text: str, marker: str) -> int:
    """The longest end of `text` that is a proper beginning of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def json_end(text: str, i: int) -> int | None:
    """The end of the JSON object or array that starts at `text[i]`, None if incomplete."""
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(text)):
        ch = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


def call_of(obj: Any) -> ParsedCall | None:
    """`{"name": ..., "arguments" | "parameters": ...}` as a call; None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # already JSON text (some models quote it)
        try:
            json.loads(args)
        except json.JSONDecodeError:
            return None
        return ParsedCall(obj["name"], args)
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


class HermesParser(ToolCallParser):
    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"

    def find_start(self, text: str, at_start: bool) -> int:
        return text.find(self.START)

    def held(self, text: str, at_start: bool) -> int:
        return partial_suffix(text, self.START)

    def take(self, text: str, final: bool) -> Taken | None:
        end = text.find(self.END, len(self.START))
        if end < 0 and not final:
            return None
        consumed = len(text) if end < 0 else end + len(self.END)
        body = text[len(self.START) : end if end >= 0 else len(text)]
        call = call_of(_loads(body.strip()))  # a model may stop without the closing tag
        return Taken([call] if call else [], consumed)


class Llama3Parser(ToolCallParser):
    name = "llama3"
    TAG = "<|python_tag|>"

    def find_start(self, text: str, at_start: bool) -> int:
        if not at_start:
            return -1
        i = len(text) - len(text.lstrip())
        return i if text.startswith((self.TAG, "{"), i) else -1

    def held(self, text: str, at_start: bool) -> int:
        rest = text.lstrip()
        return len(text) if at_start and self.TAG.startswith(rest) else 0

    def take(self, text: str, final: bool) -> Taken | None:
        tagged = text.startswith(self.TAG)
        i = len(self.TAG) if tagged else 0
        calls: list[ParsedCall] = []
        while True:
            while i < len(text) and (text[i].isspace() or text[i] == ";"):
                i += 1
            if i == len(text) and not final:
                return None  # another call may follow
            if i == len(text) or text[i] != "{":
                break
            end = json_end(text, i)
            if end is None:
                if not final:
                    return None
                if tagged or calls or _opens_call(text[i:]):
                    return Taken(calls, len(text))  # cut off in a call: dropped
                return Taken([], len(text), valid=False)
            call = call_of(_loads(text[i:end]))
            if call is None:
                if tagged or calls:
                    return Taken(calls, end)  # markup that is no call: dropped
                return Taken([], end, valid=False)  # the model's JSON answer
            calls.append(call)
            i = end
        return Taken(calls, i) if calls or tagged else Taken([], max(i, 1), valid=False)


class MistralParser(ToolCallParser):
    name = "mistral"
    START = "[TOOL_CALLS]"

    def find_start(self, text: str, at_start: bool) -> int:
        return text.find(self.START)

    def held(self, text: str, at_start: bool) -> int:
        return partial_suffix(text, self.START)

    def take(self, text: str, final: bool) -> Taken | None:
        i = len(self.START)
        while i < len(text) and text[i].isspace():
            i += 1
        end = json_end(text, i) if i < len(text) and text[i] in "[{" else None
        if end is None:
            if not final and (i == len(text) or text[i] in "[{"):
                return None
            if not final:
                return Taken([], i)  # the marker with no list after it: dropped
            return Taken(self._complete_calls(text, i), len(text))  # cut off in the list
        value = _loads(text[i:end])
        objects = value if isinstance(value, list) else [value]
        return Taken([c for c in map(call_of, objects) if c is not None], end)

    @staticmethod
    def _complete_calls(text: str, i: int) -> list[ParsedCall]:
        """The calls complete before the end, in a list cut off there (it opens at i)."""
        calls: list[ParsedCall] = []
        if not text.startswith("[", i):
            return calls
        i += 1
        while True:
            while i < len(text) and (text[i].isspace() or text[i] == ","):
                i += 1
            end = json_end(text, i) if text.startswith("{", i) else None
            if end is None:
                return calls
            call = call_of(_loads(text[i:end]))
            if call is not None:
                calls.append(call)
            i = end


_CALL_HEAD = '{"name":'


def _opens_call(text: str) -> bool:
    """Whether an incomplete JSON object opens as a call does (`{"name": ...`)."""
    head = re.sub(r"\s+", "", text[: 4 * len(_CALL_HEAD)])
    return head.startswith(_CALL_HEAD) or _CALL_HEAD.startswith(head)


PARSERS: dict[str, type[ToolCallParser]] = {
    p.name: p for p in (HermesParser, Llama3Parser, MistralParser)
}


@dataclass
class ToolCallSplitter:
    """A reply's text, fed as it streams, split into content and complete tool calls."""

    parser: ToolCallParser
    buf: str = ""
    in_call: bool = False
    at_start: bool = True  # only whitespace went out as content so far
    after_call: bool = False  # whitespace right after a call (or dropped markup) is not content
    calls: int = field(default=0)
    seen: set[tuple[str, str]] = field(default_factory=set)  # (name, canonical arguments)

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        self.buf += text
        return self._drain(final=False)

    def finish(self) -> tuple[str, list[ParsedCall]]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, list[ParsedCall]]:
        content: list[str] = []
        calls: list[ParsedCall] = []
        while self.buf:
            if not self.in_call:
                start = self.parser.find_start(self.buf, self.at_start)
                if start < 0:
                    keep = self.parser.held(self.buf, self.at_start)
                    self._content(content, self.buf[: len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep :]
                    if final:  # half a start marker at the end is dropped, whitespace kept
                        if self.buf.isspace():
                            self._content(content, self.buf)
                        self.buf = ""
                    break
                self._content(content, self.buf[:start])
                self.buf = self.buf[start:]
                self.in_call = True
            taken = self.parser.take(self.buf, final)
            if taken is None:
                break  # the call is incomplete: wait for more text
            self.in_call = False
            piece, self.buf = self.buf[: taken.consumed], self.buf[taken.consumed :]
            if taken.valid:
                new = [c for c in taken.calls if self._first_time(c)]
                calls += new
                self.calls += len(new)
                self.after_call, self.at_start = True, False
            else:
                self._content(content, piece)
        return "".join(content), calls

    def _first_time(self, call: ParsedCall) -> bool:
        key = (call.name, json.dumps(json.loads(call.arguments), sort_keys=True))
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def _content(self, out: list[str], text: str) -> None:
        if self.after_call:
            text = text.lstrip()
        if text:
            out.append(text)
            self.after_call = False
            if not text.isspace():
                self.at_start = False
