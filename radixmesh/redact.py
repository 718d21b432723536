"""Secrets out of log lines: credentials masked without knowing them, keys masked, over-long
lines cut.

A client controls what some log lines quote: aiohttp's and gRPC's own errors about a
malformed request print the raw header or metadata value ("Invalid header value char:
b'Authorization: Bearer <key>\\x0b'", "Invalid encoding on b'Basic <key>\\xff'"), and
any exception message may repeat what a request carried. A worker does not know the
router's client keys, so masking only the configured keys is not enough. So the servers
do not trust each logger to be careful; `install` wraps the process's log record factory,
and every record, from any logger (ours, aiohttp's, grpc's, a library's), to any handler
(added before or after, pytest's included), is redacted as it is made:

- the token after an authorization scheme (`Bearer`, `Basic`, `Digest`, `Negotiate`,
  `NTLM`; also after `%20`, a tab or a `\\x0b`) and the value after a credential's name
  (`authorization`, `proxy-authorization`, `*api-key*`, `x-*-key`, `*-token`, `*secret*`,
  `*password*`, `cookie`, ...), up to the end of its quoted value or line, become `***`;
- the value of gRPC's "Invalid encoding on <value>" (a metadata value a client sent, which
  never says whose header it was) becomes `***`;
- a key-shaped word (`KEY_SHAPED`: 24 or more letters, digits, `-` and `_`, with at least
  a letter and a digit; a UUID is a request id and is kept) becomes `***`;
- every configured secret (API, admin and worker keys) becomes `***` wherever it appears,
  also as Python writes it inside a repr and as a URL quotes it, and so does every piece
  of one `PIECE` characters long or longer (a key's prefix sent as a field name, a key cut
  by a limit);
- a line of the message, traceback or stack longer than `MAX_LINE` characters is cut
  (after masking, so a cut never leaves part of a key behind).

The record factory, not a `logging.Filter`: a filter on a logger does not see its
children's records, and one on a handler misses handlers added later; the factory sees
every record once, and only records that pass their logger's level (so the cost, a few
regular expressions over the message, is paid only for lines that are written: about
20-30 us a line of 100 characters, three keys configured, on a 2-core CPU machine at
load 10, 2026-12-04). A traceback is formatted and masked at once (`exc_text`), since
formatting it later would print the raw exception message. How many lines one place may
write is log_limit.py's.
"""

from __future__ import annotations

import logging
import re
import traceback
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

MASK = "***"
MAX_LINE = 2000  # characters of one line of a log record; the rest is cut
PIECE = 8  # a configured secret's pieces this long or longer are masked too

# `<scheme> <token>`: the token runs to real whitespace other than a \x0b or a tab (those
# may sit between the word and the token), so a repr's escapes and quotes after it go too.
# No word boundary before the word: "xBearer <key>" is masked all the same.
_SCHEME = re.compile(
    r"(?i)(bearer|basic|digest|negotiate|ntlm)((?:[ \t\x0b\x0c]|%20|\+|\\t|\\x0b)+)(\S*)"
)
# A credential's name, its separator (`: `, `=`, `', '` of a repr'd tuple, `": "` of
# JSON), and its value up to a quote or the end of the line.
_CREDENTIAL_NAME = (
    r"(?:proxy-)?authorization|[\w-]*api[-_]?key[\w-]*|x-[\w-]*(?:key|token|auth)[\w-]*"
    r"|(?:access|auth|refresh|session|id)[-_]?token|[\w-]*(?:secret|passw(?:or)?d|credential)s?"
    r"|set-cookie|cookie"
)
_SCHEME_WORDS = ("bearer", "basic", "digest", "negotiate", "ntlm")
_CREDENTIAL_WORDS = ("auth", "key", "token", "secret", "passw", "credential", "cookie")
_HEADER = re.compile(
    rf"(?i)\b({_CREDENTIAL_NAME})"
    r"((?:['\"]?[ \t]*[:=][ \t]*|['\"]?,[ \t]*)['\"]?)([^\r\n'\"]*)"
)
# grpc's message for a metadata value that is not UTF-8 quotes the value, not its name.
_INVALID_ENCODING = re.compile(r"(?i)(invalid encoding on )(.+)")
# A word that looks like a generated key: long, from a key's alphabet, letters and digits.
KEY_SHAPED = re.compile(r"(?<![\w-])(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9_-]{24,}(?![\w-])")
_SCHEME_MASKED = re.compile(r"(?i)(bearer|basic|digest|negotiate|ntlm)\s+\*\*\*")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class Redactor:
    """Masks credentials, key-shaped words and `secrets` (and their pieces) in text, and
    cuts over-long lines."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets: tuple[str, ...] = ()  # written forms shorter than PIECE: masked whole
        self.pieces: frozenset[str] = frozenset()  # every PIECE characters of the others
        self._forms: set[str] = set()
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """Mask these too (empty strings are skipped: they would match everywhere)."""
        for secret in secrets:
            if secret:
                self._forms |= _written_forms(secret)
        short = [f for f in self._forms if len(f) < PIECE]
        # Longest first: a secret containing another is masked whole.
        self.secrets = tuple(sorted(short, key=len, reverse=True))
        self.pieces = frozenset(
            f[i : i + PIECE]
            for f in self._forms
            if len(f) >= PIECE
            for i in range(len(f) - PIECE + 1)
        )

    def mask(self, text: str) -> str:
        """`text` with every credential, key-shaped word and secret replaced by `***`."""
        text = self._mask_pieces(text)
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        lower = text.lower()  # the expressions run only where their words occur
        if "invalid encoding on" in lower:
            text = _INVALID_ENCODING.sub(_mask_value, text)
        if any(word in lower for word in _SCHEME_WORDS):
            text = _SCHEME.sub(_mask_scheme, text)
        if any(word in lower for word in _CREDENTIAL_WORDS):
            text = _HEADER.sub(_mask_header, text)
        return KEY_SHAPED.sub(_mask_key_shaped, text)

    def __call__(self, text: str) -> str:
        """`text` masked, each line at most `MAX_LINE` characters."""
        return clip(self.mask(text))

    def _mask_pieces(self, text: str) -> str:
        """Every run of `text` covered by pieces of a secret, as one `***`: what is left of
        a secret between two masks is shorter than PIECE."""
        pieces = self.pieces
        if not pieces or len(text) < PIECE:
            return text
        covered_to = -1  # text[start:covered_to] is covered
        runs: list[tuple[int, int]] = []
        for i in range(len(text) - PIECE + 1):
            if text[i : i + PIECE] in pieces:
                if runs and i <= covered_to:
                    covered_to = i + PIECE
                    runs[-1] = (runs[-1][0], covered_to)
                else:
                    covered_to = i + PIECE
                    runs.append((i, covered_to))
        if not runs:
            return text
        out, last = [], 0
        for start, end in runs:
            out += [text[last:start], MASK]
            last = end
        out.append(text[last:])
        return "".join(out)


def clip(text: str, limit: int = MAX_LINE) -> str:
    """Each line of `text` cut to `limit` characters, saying how many were cut."""
    if len(text) <= limit:
        return text
    lines = text.split("\n")
    return "\n".join(
        line if len(line) <= limit else f"{line[:limit]}... [{len(line) - limit} characters cut]"
        for line in lines
    )


def label(name: str, limit: int = 40) -> str:
    """A client-chosen name (an unknown field's) as a log line or an error message may show
    it: characters that do not print (control characters, bidirectional overrides) escaped
    as Python escapes them, cut to `limit` characters, saying how long it was. A name can be
    anything a client sends: 10 KB, terminal escapes, a piece of its key."""
    safe = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in name[: limit + 1])
    if len(safe) <= limit and len(name) <= limit:
        return safe
    return f"{safe[:limit]}... ({len(name)} characters)"


def _mask_scheme(m: re.Match[str]) -> str:
    token = m.group(3)
    if not token or token.startswith(MASK):
        return m.group(0)
    return f"{m.group(1)}{m.group(2)}{MASK}"


def _mask_value(m: re.Match[str]) -> str:
    return m.group(0) if m.group(2).startswith(MASK) else f"{m.group(1)}{MASK}"


def _mask_header(m: re.Match[str]) -> str:
    value = m.group(3).strip()
    if not value or value == MASK or _SCHEME_MASKED.match(value):
        return m.group(0)  # nothing, or masked already (by the secrets or `Bearer ***`)
    return f"{m.group(1)}{m.group(2)}{MASK}"


def _mask_key_shaped(m: re.Match[str]) -> str:
    return m.group(0) if _UUID.fullmatch(m.group(0)) else MASK


def _written_forms(secret: str) -> set[str]:
    """How a secret may appear in a log line: as is, inside a str's or a bytes' repr, URL
    quoted (a request line)."""
    forms = {secret, repr(secret)[1:-1], repr(secret.encode())[2:-1]}
    forms.add(urllib.parse.quote(secret, safe=""))
    return {f for f in forms if f}


# ---- the process's record factory -------------------------------------------------------------

_installed: Redactor | None = None
_previous: Callable[..., logging.LogRecord] | None = None


def install(secrets: Iterable[str] = ()) -> Redactor:
    """Redact every log record this process makes from now on (see the module's doc);
    once per process: a second call adds its secrets to the first one's."""
    global _installed, _previous
    if _installed is not None:
        _installed.add(secrets)
        return _installed
    redactor = Redactor(secrets)
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return redact_record(previous(*args, **kwargs), redactor)

    logging.setLogRecordFactory(factory)
    _installed, _previous = redactor, previous
    return redactor


def uninstall() -> None:
    """Put the record factory back as it was before `install` (tests)."""
    global _installed, _previous
    if _previous is not None:
        logging.setLogRecordFactory(_previous)
    _installed, _previous = None, None


def redact_record(record: logging.LogRecord, redactor: Redactor) -> logging.LogRecord:
    """`record` with its message, traceback and stack masked and clipped; the message is
    formatted now (its arguments may hold the secret) and the arguments dropped."""
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: logging would print msg and args raw
        message = f"{record.msg!s} (arguments: {record.args!r})"
    record.msg, record.args = redactor(message), ()
    if record.exc_info and record.exc_info[0] is not None:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        # Formatters print exc_text as it is; the exception is dropped, so that no handler
        # formats it again, raw.
        record.exc_text, record.exc_info = redactor(text), None
    if record.stack_info:
        record.stack_info = redactor(record.stack_info)
    return record
