"""Secrets out of log lines: keys masked, over-long lines cut.

A client controls what some log lines quote: aiohttp's and gRPC's own errors about a
malformed request print the raw header or metadata value ("Invalid header value char:
b'Authorization: Bearer <key>\\x0b'", "Invalid encoding on b'Bearer <key>\\xff'"), and
any exception message may repeat what a request carried. So the servers do not trust
each logger to be careful; `install` wraps the process's log record factory, and every
record, from any logger (ours, aiohttp's, grpc's, a library's), to any handler (added
before or after, pytest's included), is redacted as it is made:

- the token after `Bearer` (also as `Bearer%20`, after a tab or a `\\x0b`) and the value
  after an `authorization` / `x-api-key` / `api-key` / `cookie` name, up to the end of its
  quoted value or line, become `***`;
- every configured secret (API, admin and worker keys) becomes `***` wherever it appears,
  also as Python writes it inside a repr and as a URL quotes it;
- a line of the message, traceback or stack longer than `MAX_LINE` characters is cut
  (after masking, so a cut never leaves part of a key behind).

The record factory, not a `logging.Filter`: a filter on a logger does not see its
children's records, and one on a handler misses handlers added later; the factory sees
every record once, and only records that pass their logger's level (so the cost, a few
regular expressions over the message, is paid only for lines that are written: about
4 us a line on a 2-core CPU machine, 2026-12-02). A traceback is formatted and masked
at once (`exc_text`), since formatting it later would print the raw exception message.
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

# `Bearer <token>`: the token runs to real whitespace other than a \x0b or a tab (those may
# sit between the word and the token), so a repr's escapes and quotes after it go too. No
# word boundary before the word: "xBearer <key>" is masked all the same.
_BEARER = re.compile(r"(?i)(bearer)((?:[ \t\x0b\x0c]|%20|\+|\\t|\\x0b)*)(\S*)")
# A credential header's name, its separator (`: `, `=`, `', '` of a repr'd tuple, `": "` of
# JSON), and its value up to a quote or the end of the line.
_HEADER = re.compile(
    r"(?i)\b(proxy-authorization|authorization|x-api-key|api-key|api_key|cookie|set-cookie)"
    r"((?:['\"]?[ \t]*[:=][ \t]*|['\"]?,[ \t]*)['\"]?)([^\r\n'\"]*)"
)


class Redactor:
    """Masks credentials and `secrets` in text, and cuts over-long lines."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets: tuple[str, ...] = ()
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """Mask these too (empty strings are skipped: they would match everywhere)."""
        forms = set(self.secrets)
        for secret in secrets:
            if secret:
                forms |= _written_forms(secret)
        # Longest first: a secret containing another is masked whole.
        self.secrets = tuple(sorted(forms, key=len, reverse=True))

    def mask(self, text: str) -> str:
        """`text` with every credential and secret replaced by `***`."""
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        text = _BEARER.sub(_mask_bearer, text)
        return _HEADER.sub(_mask_header, text)

    def __call__(self, text: str) -> str:
        """`text` masked, each line at most `MAX_LINE` characters."""
        return clip(self.mask(text))


def clip(text: str, limit: int = MAX_LINE) -> str:
    """Each line of `text` cut to `limit` characters, saying how many were cut."""
    if len(text) <= limit:
        return text
    lines = text.split("\n")
    return "\n".join(
        line if len(line) <= limit else f"{line[:limit]}... [{len(line) - limit} characters cut]"
        for line in lines
    )


def _mask_bearer(m: re.Match[str]) -> str:
    return f"{m.group(1)}{m.group(2)}{MASK}" if m.group(3) else m.group(0)


def _mask_header(m: re.Match[str]) -> str:
    value = m.group(3)
    if not value.strip() or value.strip() == MASK or value.lower().startswith("bearer " + MASK):
        return m.group(0)  # nothing, or masked already (by the secrets or `Bearer ***`)
    return f"{m.group(1)}{m.group(2)}{MASK}"


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
