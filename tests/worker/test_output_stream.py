"""The worker's output stream: what goes in one message, joined and held as promised."""

from __future__ import annotations

import asyncio

import pytest

from radixmesh.errors import Unavailable
from radixmesh.worker.output_stream import OutputStream
from radixmesh.worker.request_output import MetaInfo, RequestOutput


def out(rid: str, tokens: list[int], n: int, finished: bool = False) -> RequestOutput:
    meta = MetaInfo(id=rid, prompt_tokens=4, completion_tokens=n, cached_tokens=0)
    return RequestOutput(rid, tokens, "".join(f"<{t}>" for t in tokens), finished, meta)


def take(stream: OutputStream) -> list[tuple[str, list[int], str, int]]:
    batch = asyncio.run(asyncio.wait_for(stream.take(), 1.0))
    assert batch is not None
    return [(rid, o.new_token_ids, o.text_delta, o.meta_info.completion_tokens) for rid, o in batch]


def test_outputs_that_pile_up_go_joined_in_order_of_readiness() -> None:
    s = OutputStream()
    s.put("b", out("b", [7], 1), send=True)
    s.put("a", out("a", [1], 1), send=True)
    s.put("b", out("b", [8, 9], 3), send=True)
    assert take(s) == [("b", [7, 8, 9], "<7><8><9>", 3), ("a", [1], "<1>", 1)]
    s.put("a", out("a", [2], 2), send=True)
    assert take(s) == [("a", [2], "<2>", 2)]


def test_held_outputs_wait_for_one_that_may_go() -> None:
    s = OutputStream()
    s.put("u", out("u", [1], 1), send=True)  # a whole reply's first output goes at once
    assert take(s) == [("u", [1], "<1>", 1)]
    s.put("u", out("u", [2], 2), send=False)
    s.put("u", out("u", [3], 3), send=False)
    s.put("v", out("v", [5], 1), send=True)
    assert take(s) == [("v", [5], "<5>", 1)]  # u's middle is held
    s.put("u", out("u", [4], 4, finished=True), send=True)
    assert take(s) == [("u", [2, 3, 4], "<2><3><4>", 4)]


def test_a_held_output_rides_along_with_a_ready_one() -> None:
    s = OutputStream()
    s.put("u", out("u", [1], 1), send=True)
    s.put("u", out("u", [2], 2), send=False)  # not taken yet: joins the first
    assert take(s) == [("u", [1, 2], "<1><2>", 2)]


def test_discard_and_close() -> None:
    s = OutputStream()
    s.put("a", out("a", [1], 1), send=True)
    s.put("b", out("b", [2], 1), send=False)
    s.discard("a")
    s.discard("b")
    with pytest.raises(TimeoutError):
        take(s)  # nothing left to send
    s.close()
    with pytest.raises(Unavailable, match="closed"):
        s.put("c", out("c", [3], 1), send=True)


def test_closing_lets_the_ready_outputs_go_first() -> None:
    s = OutputStream()
    s.put("a", out("a", [1, 2], 2, finished=True), send=True)  # a request's last output
    s.put("b", out("b", [3], 1), send=False)
    s.close()
    assert take(s) == [("a", [1, 2], "<1><2>", 2)]
    assert asyncio.run(asyncio.wait_for(s.take(), 1.0)) is None  # then the stream ends
