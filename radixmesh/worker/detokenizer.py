"""Incremental detokenization of one request's output, with stop strings.

Decoding token by token (`decode([t])`) is wrong for byte-level BPE: a token may hold
half of a UTF-8 character, and some decoders drop or add spaces at the start of a decode.
Decoding the whole output every step is right but costs O(length) per token. Instead we
keep a short window of ids: `[prefix, read)` was already emitted, `[read, end)` is new.
The new text is `decode(ids[prefix:end]) minus decode(ids[prefix:read])`, where `end`
is the last token boundary at which the text is complete (does not end in U+FFFD, the
mark of a cut UTF-8 sequence); the `prefix` tokens give the decoder the context it needs,
and the window then slides to `[read, end)`.

Stop strings are then found in the text: text that might be the start of a stop string
is held back, so nothing emitted is ever retracted. Stop regexes (radixmesh/stop_regex.py)
are searched in the tail of the text after the stop strings; no text is held back for them
(a regex has no "might start a match" test), so the text ends with the match: the
matched text is kept, as in SGLang's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from radixmesh.stop_regex import WINDOW, StopRegexes, StopRegexTimeout

# Prompt tokens decoded ahead of the output: SentencePiece-style decoders drop a leading
# space at the start of a decode, so the first output token needs left context.
_PROMPT_CONTEXT = 5
# A UTF-8 character spans at most 4 bytes, so at most 4 tokens. New ids that decode to
# text ending in U+FFFD at every token boundary for this long hold invalid bytes: emit
# what is final of them (as U+FFFD, like a full decode) rather than let the window grow.
_MAX_INCOMPLETE_TOKENS = 6
_MAX_UNFINISHED_BYTES = 3  # bytes of a character still waiting for its last byte
_REPLACEMENT = "\ufffd"


class TokenDecoder(Protocol):
    """What the detokenizer needs of a tokenizer (HF tokenizers and ours both fit)."""

    def decode(self, token_ids: Sequence[int], /, *, skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Turns a stream of output ids into text, emitting only what is final.

    The concatenation of every `push` result and `finish()` equals `text`; without a stop
    match it equals `tokenizer.decode(output_ids)`. With stop strings the text ends right
    before the first stop string to complete (with it, if `no_stop_trim`); among stops
    completing at the same character the one starting earliest wins. After a match,
    `push` and `finish` return "". Each push costs O(window + longest stop), not O(output).
    """

    def __init__(
        self,
        tokenizer: TokenDecoder,
        prompt_ids: Sequence[int] | None = None,
        *,
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        no_stop_trim: bool = False,
        stop_regex: Sequence[str] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self._regexes = StopRegexes(stop_regex)
        self._has_regexes = bool(self._regexes)  # read per token: not a method call each
        self.error: str | None = None  # a stop regex's search ran out of time
        self._tail = ""  # the last stop_regex.WINDOW emitted characters (with regexes)
        self._skip_special = skip_special_tokens
        self._stops = tuple(s for s in stop if s)
        self._no_stop_trim = no_stop_trim
        self._ids = self._prompt_context(prompt_ids)  # the window; older ids are dropped
        self._prefix = 0  # ids[prefix:read] give context, already emitted
        self._read = len(self._ids)  # ids[read:] are not yet emitted
        self._pending = ""  # decoded text held back: it may begin a stop string
        self._pieces: list[str] = []
        self._matched: str | None = None
        # Whether stop strings or regexes may end the text (then pushes must be token by
        # token to know which token ended it). Read per token: a field, not a property.
        self.has_stops = bool(self._stops) or self._has_regexes
        self.deferred = False  # ids added by `defer` that no push or finish decoded yet

    @property
    def text(self) -> str:
        """All text emitted so far (after stop trimming)."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def ended(self) -> bool:
        """Whether a stop string or regex matched, or a regex search failed: the text is
        over (the caller finishes the request)."""
        return self._matched is not None or self.error is not None

    @property
    def matched_stop(self) -> str | None:
        """The stop string (or stop regex pattern) that ended the text, once one did."""
        return self._matched

    def defer(self, token_ids: Sequence[int]) -> None:
        """Add output tokens without decoding them yet: the next `push` or `finish`
        decodes them with its own. The text is the same (the pieces' concatenation does
        not depend on how the ids were chunked into pushes), so a caller that needs no
        text until later saves a decode per token. Not with stops (`has_stops`): which
        token ended the text is known only by decoding each as it comes."""
        if self.has_stops:
            raise ValueError("defer: stop strings need each token's text as it comes")
        self._ids.extend(token_ids)
        self.deferred = True

    def defer_token(self, token_id: int) -> None:
        """`defer` of one token, without a sequence to hold it (the output path's call,
        once per token)."""
        if self.has_stops:
            raise ValueError("defer: stop strings need each token's text as it comes")
        self._ids.append(token_id)
        self.deferred = True

    def push(self, token_ids: Sequence[int]) -> str:
        """Add output tokens; return the new text that is safe to emit now."""
        if self._matched is not None or self.error is not None:
            return ""
        self._ids.extend(token_ids)
        self.deferred = False
        return self._emit(self._decode_new(final=False), final=False)

    def finish(self) -> str:
        """Flush everything held back (incomplete characters, a partial stop string)."""
        if self._matched is not None or self.error is not None:
            return ""
        self.deferred = False
        return self._emit(self._decode_new(final=True), final=True)

    # --- tokens -> text -------------------------------------------------------------------

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def _prompt_context(self, prompt_ids: Sequence[int] | None) -> list[int]:
        context = list(prompt_ids[-_PROMPT_CONTEXT:]) if prompt_ids else []
        # A prompt cut inside a character would misalign the first output text.
        if context and self._decode(context).endswith(_REPLACEMENT):
            return []
        return context

    def _decode_new(self, *, final: bool) -> str:
        """The text of the new ids up to the last point where it is complete.

        Ids past that point (the start of a character whose other bytes are still to
        come) stay unread; at `final` everything is decoded as is.
        """
        if self._read == len(self._ids):
            return ""
        seen = self._decode(self._ids[self._prefix : self._read])
        end, text = self._complete_end(seen, final=final)
        # Slide: the ids just read become the context of the next ones.
        del self._ids[: self._read]
        self._prefix, self._read = 0, end - self._read
        return text[len(seen) :]

    def _complete_end(self, seen: str, *, final: bool) -> tuple[int, str]:
        """(end, decode(ids[prefix:end])) for the largest end whose text is complete."""
        end = len(self._ids)
        text = self._decode(self._ids[self._prefix :])
        if final:
            return end, text
        # Usually one step back at most: only a cut character ends in U+FFFD.
        while text.endswith(_REPLACEMENT) and end > self._read + 1:
            end -= 1
            text = self._decode(self._ids[self._prefix : end])
        if not text.endswith(_REPLACEMENT):
            return end, text
        if len(self._ids) - self._read < _MAX_INCOMPLETE_TOKENS:
            return self._read, seen  # wait for the rest of the character
        return self._invalid_bytes_end(seen)

    def _invalid_bytes_end(self, seen: str) -> tuple[int, str]:
        """Like `_complete_end` for a window of invalid bytes (no end is complete).

        Later bytes can only change how the last unfinished character decodes, at most
        its 3 bytes; so text before a cut that leaves the last 3 ids unread, and where
        splitting does not change the text, is final.
        """
        full = self._decode(self._ids[self._prefix :])
        for end in range(len(self._ids) - _MAX_UNFINISHED_BYTES, self._read, -1):
            head = self._decode(self._ids[self._prefix : end])
            if head + self._decode(self._ids[end:]) == full:
                return end, head
        return self._read, seen

    # --- text -> emitted text (stop strings) --------------------------------------------

    def _emit(self, new: str, *, final: bool) -> str:
        if self._stops:
            new = self._cut_at_stop(self._pending + new, final=final)
        if self._has_regexes and new:
            new = self._cut_at_regex(new)
            self._tail = (self._tail + new)[-WINDOW:]
        if new:
            self._pieces.append(new)
        return new

    def _cut_at_stop(self, text: str, *, final: bool) -> str:
        """What of `text` (held-back text + new text) may be emitted; holds the rest."""
        hit = self._first_stop(text)
        if hit is not None:
            start, stop = hit
            self._matched, self._pending = stop, ""
            return text[: start + len(stop)] if self._no_stop_trim else text[:start]
        hold = 0 if final else self._partial_stop_len(text)
        self._pending = text[len(text) - hold :]
        return text[: len(text) - hold]

    def _cut_at_regex(self, new: str) -> str:
        """What of `new` may be emitted, given the stop regexes (see the module doc)."""
        try:
            hit = self._regexes.first_match(self._tail, new)
        except StopRegexTimeout as e:
            self.error, self._pending = str(e), ""
            return ""
        if hit is None:
            return new
        _, end, pattern = hit
        self._matched, self._pending = pattern, ""
        return new[: max(0, end)]

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        """(start, stop) of the stop string that completes first in `text`, if any.

        Held-back text never contains a whole stop and emitted text never holds the start
        of one, so searching held-back + new text finds every match.
        """
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = text.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
                best = (start + len(stop), start, stop)
        return None if best is None else (best[1], best[2])

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that some stop string starts with."""
        longest = max(len(s) for s in self._stops) - 1
        for n in range(min(len(text), longest), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0


__all__ = ["IncrementalDetokenizer", "TokenDecoder"]
