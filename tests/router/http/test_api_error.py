"""api_error.py: what an error reply may show of a client's field names and messages."""

from __future__ import annotations

import json

from radixmesh.router.http.api_error import MAX_MESSAGE, ApiError

ODD = "x\x00\x1b[31m\u202e" + "y" * 5000  # an unknown field's name, as a client may send it


def test_a_field_name_is_cut_and_escaped_where_it_is_named() -> None:
    e = ApiError(400, f"unknown or unsupported field {ODD!r}", ODD, "invalid_argument")
    shown = "x\\x00\\x1b[31m\\u202e" + "y" * 45 + "... (5008 characters)"  # 64 shown
    assert e.param == shown
    assert e.message == f"unknown or unsupported field '{shown}'"
    assert json.dumps(e.to_json()).count("y") < 100


def test_a_name_the_message_quotes_as_json_is_replaced_too() -> None:
    e = ApiError(400, f"unknown field {json.dumps(ODD)}", ODD)
    assert e.message == f'unknown field "{e.param}"'


def test_messages_are_cut_and_keep_their_line_breaks() -> None:
    long = ApiError(400, "z" * (MAX_MESSAGE + 10))
    assert long.message == "z" * MAX_MESSAGE + f"... ({MAX_MESSAGE + 10} characters)"
    assert ApiError(400, "line 1\n\tline 2\x07").message == "line 1\n\tline 2\\x07"
    plain = ApiError(400, "must be <= 2, got 3", "temperature", "invalid_argument")
    assert (plain.message, plain.param) == ("must be <= 2, got 3", "temperature")
