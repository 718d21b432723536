"""redact.py: credentials and configured keys masked, long lines cut, every log record."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from radixmesh import redact
from radixmesh.redact import MASK, MAX_LINE, Redactor, clip, label

KEY = "sk-test-4f9a1c"
ODD = "k'\\ey%&"  # printable ASCII a config accepts, escaped differently by repr and URLs


@pytest.mark.parametrize(
    "text",
    [
        f"Authorization: Bearer {KEY}",
        f"b'Authorization: Bearer {KEY}\\x0b'",  # aiohttp's "Invalid header value char"
        f"b'Authorization: Bearer {KEY}\\x00'",
        f"b'Authorization: Bearer {KEY}\\x7f'",
        f"b'Authorization: Bearer {KEY}\\rX-Other: 1'",  # a bare CR
        f"Authorization: Bearer {KEY}\x0b",  # the raw characters
        f"Authorization: Bearer {KEY}\x00\x7f",
        f"b'Bearer {KEY}{'A' * 90}...'",  # aiohttp's LineTooLong, the key inside the cut
        f"b'GET /x?k=Bearer%20{KEY}\\x0b HTTP/1.1'",  # a request line
        f"Bearer\t{KEY}",
        f"Bearer\x0b{KEY}",
        f"bearer {KEY}",
        f"(('authorization', 'Bearer {KEY}'), ('user-agent', 'grpc-python'))",
    ],
)
def test_bearer_tokens_are_masked_without_knowing_the_key(text: str) -> None:
    out = Redactor()(text)
    assert KEY not in out
    assert f"Bearer{MASK}" in out.replace(" ", "").replace("\t", "").replace("\x0b", "").replace(
        "%20", ""
    ).replace("bearer", "Bearer")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (f"x-api-key: {KEY}", f"x-api-key: {MASK}"),
        (f"X-Api-Key={KEY}&other=1", f"X-Api-Key={MASK}"),
        (f'{{"api-key": "{KEY}", "n": 1}}', f'{{"api-key": "{MASK}", "n": 1}}'),
        (f"('x-api-key', '{KEY}\\x00')", f"('x-api-key', '{MASK}')"),
        (f"Authorization: Basic {KEY}", f"Authorization: Basic {MASK}"),
        (f"Cookie: session={KEY}", f"Cookie: {MASK}"),
        (f"authorization: Bearer {KEY}", f"authorization: Bearer {MASK}"),
    ],
)
def test_credential_headers_are_masked(text: str, want: str) -> None:
    assert Redactor()(text) == want


def test_configured_keys_are_masked_wherever_they_appear() -> None:
    r = Redactor([KEY, ODD, ""])  # the empty key is skipped, not masked everywhere
    assert r(f"token={KEY}; other") == f"token={MASK}; other"
    assert r(f"{KEY}{KEY}") == MASK  # one run of the key's pieces
    assert r(f"got {ODD!r}") == f'got "{MASK}"'  # repr escapes the backslash
    assert r(f"got {ODD.encode()!r}") == f'got b"{MASK}"'
    assert r("/x?k=k%27%5Cey%25%26") == f"/x?k={MASK}"  # URL-quoted
    assert r("nothing secret here") == "nothing secret here"
    r.add(["other-secret-1"])
    assert r("other-secret-1 and " + KEY) == f"{MASK} and {MASK}"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (f"Authorization: Basic {KEY}\x0b", f"Authorization: Basic {MASK}\x0b"),
        (f"b'basic {KEY}\\xff'", f"b'basic {MASK}"),
        (f"Digest username={KEY}", f"Digest {MASK}"),
        (f"Negotiate\t{KEY}", f"Negotiate\t{MASK}"),
        # grpc's error for metadata that is not UTF-8: the value, whatever it holds.
        (f"Invalid encoding on b'{KEY}\\xff'", f"Invalid encoding on {MASK}"),
        (f"Invalid encoding on b'Basic {KEY}\\xff'", f"Invalid encoding on {MASK}"),
        (f"x-goog-api-key: {KEY}", f"x-goog-api-key: {MASK}"),
        (f"X-Auth-Token={KEY}", f"X-Auth-Token={MASK}"),
        (f"('x-custom-key', '{KEY}')", f"('x-custom-key', '{MASK}')"),
        (f'{{"client_secret": "{KEY}"}}', f'{{"client_secret": "{MASK}"}}'),
        (f"password={KEY}", f"password={MASK}"),
        (f"access_token: {KEY}", f"access_token: {MASK}"),
    ],
)
def test_every_scheme_and_credential_name_is_masked(text: str, want: str) -> None:
    assert Redactor()(text) == want


def test_key_shaped_words_are_masked() -> None:
    r = Redactor()
    key = "Zq3xW9vLmP0aRt7yK2nB5cDe8fGh"  # secrets.token_urlsafe's alphabet, 28 characters
    assert r(f"unknown field {key!r}") == f"unknown field '{MASK}'"
    assert r(f"got {'0123456789abcdef' * 4} as a key") == f"got {MASK} as a key"  # hex
    rid = "3f2a9c4e-1b7d-4e8a-9f0c-2d6b8a1e5c7f"  # a UUID is a request id, not a key
    assert r(f"request {rid} aborted") == f"request {rid} aborted"
    for kept in (
        'File "/work/main/.venv/lib/python3.12/site-packages/grpc/aio/_server.py", line 48',
        "radixmesh.router.http.openai.responses_api.routes: served 12 requests",
        "HuggingFaceTB/SmolLM2-135M-Instruct on worker-0",
        "a_very_long_python_identifier_without_digits",
    ):
        assert r(kept) == kept


def test_pieces_of_configured_keys_are_masked() -> None:
    key = "ck-live-9Xq2mV7pL4wZ"
    r = Redactor([key, "short"])
    # A prefix sent as a field name, a cut key, a piece inside other text: none left.
    assert r(f"unknown field {key[:9]!r}") == f"unknown field '{MASK}'"
    assert r(f"got {key[3:15]}...") == f"got {MASK}..."
    assert r(f"x{key[5:13]}y and {key}") == f"x{MASK}y and {MASK}"
    assert r(f"{key[:7]} stays") == f"{key[:7]} stays"  # shorter than a piece
    assert r("the key: short") == f"the key: {MASK}"


def test_ordinary_lines_are_left_alone() -> None:
    r = Redactor([KEY])
    for line in (
        "worker worker-0 failed (UNAVAILABLE); retrying",
        "radixmesh router on port 50050; waiting for workers",
        "draining: 3 requests in flight",
        "authorization failed",  # a name without a value
    ):
        assert r(line) == line


def test_long_lines_are_cut_after_masking() -> None:
    assert clip("a" * MAX_LINE) == "a" * MAX_LINE
    # The key straddles the cut, and no word boundary comes before "Bearer".
    line = "x" * (MAX_LINE - 10) + f"Bearer {KEY} " + "y" * 500
    first, second = Redactor()(f"short\n{line}").split("\n")
    assert first == "short"
    kept = "x" * (MAX_LINE - 10) + "Bearer ***"  # 10 characters: the masked line's first 2000
    assert second == f"{kept}... [{1 + 500} characters cut]"


@pytest.fixture
def installed() -> Iterator[Redactor]:
    # A router or worker served in-process by an earlier test installed it for the process
    # (once per process, by design), maybe under another library's factory since: start
    # from none, so that uninstalling restores exactly what this test found.
    redact.uninstall()
    before = logging.getLogRecordFactory()
    r = redact.install([KEY])
    try:
        yield r
    finally:
        redact.uninstall()
        assert logging.getLogRecordFactory() is before


def test_installed_every_record_is_redacted(
    installed: Redactor, caplog: pytest.LogCaptureFixture
) -> None:
    assert redact.install(["second-key-77"]) is installed  # once per process: keys add up
    log = logging.getLogger("some.library.module")  # any logger, a handler added later
    with caplog.at_level(logging.INFO):
        log.info("metadata %r", (("authorization", f"Bearer {KEY}\x0b"),))
        log.warning("the worker key is %s and %s", KEY, "second-key-77")
        log.info("x" * (MAX_LINE + 5))
        try:
            raise ValueError(f"Invalid header value char: b'x-api-key: {KEY}\\x00'")
        except ValueError:
            log.exception("Error handling request from %s", "127.0.0.1")
        log.info("bad format %s %s", KEY)  # logging would print the arguments raw
        log.info("stack", stack_info=True, extra={"note": 1})
    text = caplog.text
    assert KEY not in text and "second-key-77" not in text
    assert "the worker key is *** and ***" in text
    assert "... [5 characters cut]" in text
    error = caplog.records[3]
    assert error.exc_info is None and error.exc_text is not None  # formatted, then masked
    assert "ValueError: Invalid header value char: b'x-api-key: ***'" in error.exc_text
    assert "bad format %s %s (arguments: ('***',))" in text
    assert [r.args for r in caplog.records] == [()] * 6


def test_uninstalled_records_are_as_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        logging.getLogger("plain").info("Bearer %s", "visible")
    assert caplog.records[0].getMessage() == "Bearer visible"


def test_a_client_chosen_name_is_cut_and_escaped() -> None:
    assert label("max_tokens") == "max_tokens"
    assert (
        label("x\x00\x1b[31m\u202e") == "x\\x00\\x1b[31m\\u202e"
    )  # nothing raw reaches a terminal
    assert label("a" * 40) == "a" * 40
    assert label("a" * 5000) == "a" * 40 + "... (5000 characters)"
    assert label("\x00" * 30, limit=8) == "\\x00\\x00... (30 characters)"
