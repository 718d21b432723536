"""The store of Responses (bounds, expiry, callers, delete) with a driven clock, and a
stored response's input items as `input_items` lists and pages them."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.openai.responses_api import requests as rq
from radixmesh.router.http.openai.responses_api.items import listed, page, page_params
from radixmesh.router.http.openai.responses_api.store import MemoryResponseStore, StoredResponse

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def entry(rid: str, text: str = "", output: tuple[dict[str, Any], ...] = ()) -> StoredResponse:
    """A stored response with one input item: `SIZE + len(text)` accounted bytes."""
    item = {"id": "m", "text": text}
    return StoredResponse({"id": rid, "output": list(output)}, (item,))


# The text of its keys and values (ids of two characters), 512 per item, 2048 per entry.
SIZE = len("id" + "r1" + "output" + "id" + "m" + "text") + 512 + 2048


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_is_its_callers_until_deleted() -> None:
    store = MemoryResponseStore(max_entries=10, max_bytes=10_000, ttl=10.0)
    stored = entry("r1", "x")
    assert run(store.put("alice", stored))
    assert run(store.get("alice", "r1")) is stored
    assert run(store.get("bob", "r1")) is None  # another caller's id reads as unknown
    assert not run(store.delete("bob", "r1"))
    assert run(store.delete("alice", "r1"))
    assert run(store.get("alice", "r1")) is None
    assert not run(store.delete("alice", "r1"))
    assert (len(store), store.bytes) == (0, 0)


def test_conversation_is_the_input_items_then_the_output() -> None:
    out = ({"id": "msg_2", "type": "message"},)
    assert entry("r1", output=out).conversation() == ({"id": "m", "text": ""}, *out)


def test_entries_bound_drops_the_oldest() -> None:
    store = MemoryResponseStore(max_entries=2, max_bytes=10_000, ttl=10.0)
    for rid in ("r1", "r2", "r3"):
        assert run(store.put("alice", entry(rid)))
    assert [run(store.get("alice", r)) is not None for r in ("r1", "r2", "r3")] == [
        False,
        True,
        True,
    ]
    assert (len(store), store.bytes) == (2, 2 * SIZE)
    assert not run(MemoryResponseStore(0, 10_000, 10.0).put("alice", entry("r1")))


def test_bytes_bound_drops_the_oldest_and_refuses_an_entry_alone_over_it() -> None:
    store = MemoryResponseStore(max_entries=100, max_bytes=3 * SIZE + 300, ttl=10.0)
    assert run(store.put("alice", entry("r1", "a" * 100)))
    assert run(store.put("alice", entry("r2", "b" * 100)))
    assert run(store.put("alice", entry("r3", "c" * 100)))
    assert run(store.get("alice", "r1")) is not None and store.bytes == 3 * SIZE + 300
    assert run(store.put("alice", entry("r4", "d")))  # one byte over: r1 goes
    assert run(store.get("alice", "r1")) is None and run(store.get("alice", "r2")) is not None
    assert store.bytes == 3 * SIZE + 201
    assert not run(store.put("alice", entry("big", "e" * (2 * SIZE + 301))))  # alone over it
    assert run(store.get("alice", "big")) is None and len(store) == 3
    assert not run(MemoryResponseStore(10, 0, 10.0).put("alice", entry("r1")))


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    store = MemoryResponseStore(max_entries=10, max_bytes=10_000, ttl=10.0, clock=clock)
    assert run(store.put("alice", entry("r1")))
    clock.now = 5.0
    assert run(store.put("alice", entry("r2")))
    clock.now = 9.999
    assert run(store.get("alice", "r1")) is not None
    clock.now = 10.0  # r1's ttl is up, not r2's
    assert run(store.get("alice", "r1")) is None and run(store.get("alice", "r2")) is not None
    assert (len(store), store.bytes) == (1, SIZE)
    clock.now = 15.0
    assert not run(store.delete("alice", "r2"))
    assert (len(store), store.bytes) == (0, 0)


# ---- input items ------------------------------------------------------------------------


def user(text: str, item_id: str | None = None) -> rq.MessageItem:
    return rq.MessageItem(
        id=item_id, role="user", content=[rq.InputText(type="input_text", text=text)]
    )


def test_listed_items_keep_the_clients_ids_and_take_new_ones() -> None:
    call = rq.FunctionCallItem(type="function_call", call_id="c1", name="f", arguments="{}")
    output = rq.FunctionCallOutputItem(
        type="function_call_output",
        call_id="c1",
        output=[rq.InputText(type="input_text", text="3")],
    )
    reasoning = rq.ReasoningItem(type="reasoning")
    got = listed(
        [user("a", "msg_mine"), call, reasoning, output, user("b", "msg_old")], ["msg_old"]
    )
    assert got[0]["id"] == "msg_mine"
    assert [got[i]["id"].split("_")[0] for i in (1, 2, 3)] == ["fc", "fco", "msg"]
    assert got[0] == {
        "id": "msg_mine",
        "type": "message",
        "status": "completed",
        "role": "user",
        "content": [{"type": "input_text", "text": "a"}],
    }
    assert got[1] | {"id": "fc"} == {
        "id": "fc",
        "type": "function_call",
        "status": "completed",
        "call_id": "c1",
        "name": "f",
        "arguments": "{}",
    }
    assert got[2]["output"] == "3" and got[2]["call_id"] == "c1"
    assert got[3]["id"] != "msg_old"  # taken by an item before it
    assert len({item["id"] for item in got}) == 4
    # Listed items go back in as the same items.
    again = rq.items_of(got)
    assert [type(i) for i in again] == [
        rq.MessageItem,
        rq.FunctionCallItem,
        rq.FunctionCallOutputItem,
        rq.MessageItem,
    ]


ITEMS = [{"id": f"i{n}"} for n in range(5)]


def ids(listing: dict[str, Any]) -> list[str]:
    return [item["id"] for item in listing["data"]]


def test_pages_in_either_order() -> None:
    first = page(ITEMS, None, 2, ascending=False)
    assert (ids(first), first["first_id"], first["last_id"], first["has_more"]) == (
        ["i4", "i3"],
        "i4",
        "i3",
        True,
    )
    assert ids(page(ITEMS, "i3", 2, ascending=False)) == ["i2", "i1"]
    last = page(ITEMS, "i1", 2, ascending=False)
    assert (ids(last), last["has_more"]) == (["i0"], False)
    assert ids(page(ITEMS, "i1", 20, ascending=True)) == ["i2", "i3", "i4"]
    whole = page(ITEMS, None, 5, ascending=True)
    assert (ids(whole), whole["has_more"], whole["object"]) == (
        ["i0", "i1", "i2", "i3", "i4"],
        False,
        "list",
    )
    end = page(ITEMS, "i4", 3, ascending=True)
    assert (end["data"], end["first_id"], end["last_id"], end["has_more"]) == (
        [],
        None,
        None,
        False,
    )


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"order": "newest"}, "order"),
    ],
)
def test_bad_page_parameters_are_named(query: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        page_params(query)
    assert e.value.field == field


def test_page_parameters_and_an_unknown_after() -> None:
    assert page_params({}) == (None, 20, False)
    assert page_params({"after": "i1", "limit": "100", "order": "asc"}) == ("i1", 100, True)
    with pytest.raises(InvalidArgument) as e:
        page(ITEMS, "nope", 2, ascending=True)
    assert e.value.field == "after"
