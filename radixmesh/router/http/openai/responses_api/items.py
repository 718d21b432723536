"""A stored response's input items as `GET /v1/responses/{id}/input_items` lists them.

The items a response was generated from are its conversation before it (the input items
and the output of the responses it continues, through `previous_response_id`) and then
its own `input`: all the model read but `instructions` (OpenAI's list is "the items used
to generate this response", without them). Each is kept in OpenAI's item layout with an
`id`: the one the client gave the item (output items sent back carry theirs), else a new
one (`msg_`, `fc_`, `fco_`); an id already taken in the list gets a new one, so that
`after` finds one place. `reasoning` items are dropped from the prompt, and so from the
list.

The page is OpenAI's list: `data`, `first_id`, `last_id`, `has_more`; `order` `desc` (the
default: the newest item first) or `asc`, `limit` 1 to 100 (default 20), `after` an id of
the list (the page starts after it).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.openai.responses_api import requests as rq

Json = dict[str, Any]

_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}
DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def listed(items: Iterable[rq.Item], taken: Iterable[str]) -> list[Json]:
    """The request's input items in the list's layout, each with an id not in `taken`."""
    used = set(taken)
    out = []
    for item in items:
        if isinstance(item, rq.ReasoningItem):
            continue
        item_id = item.id if item.id is not None and item.id not in used else _new_id(item.type)
        used.add(item_id)
        out.append(_layout(item, item_id))
    return out


def _new_id(kind: str) -> str:
    return _PREFIXES[kind] + uuid.uuid4().hex


def _layout(
    item: rq.MessageItem | rq.FunctionCallItem | rq.FunctionCallOutputItem, item_id: str
) -> Json:
    head = {"id": item_id, "type": item.type}
    if isinstance(item, rq.MessageItem):
        content = [_part(p) for p in item.content]
        return head | {"status": "completed", "role": item.role, "content": content}
    if isinstance(item, rq.FunctionCallItem):
        fields = {"call_id": item.call_id, "name": item.name, "arguments": item.arguments}
        return head | {"status": "completed", **fields}
    parts = [_part(p) for p in item.output]
    # One text part was most likely sent as a string: it is listed as one.
    output: str | list[Json] = (
        parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "input_text" else parts
    )
    return head | {"status": "completed", "call_id": item.call_id, "output": output}


def _part(part: rq.InputText | rq.Refusal | rq.Unreadable) -> Json:
    if isinstance(part, rq.InputText):
        extra: Json = {"annotations": []} if part.type == "output_text" else {}
        return {"type": part.type, "text": part.text, **extra}
    if isinstance(part, rq.Refusal):
        return {"type": "refusal", "refusal": part.refusal}
    # The conversion refuses these parts before anything is stored.
    raise AssertionError(f"an unreadable part ({part.type}) reached the store")


def page_params(query: Mapping[str, str]) -> tuple[str | None, int, bool]:
    """`after`, `limit` and whether the order is ascending, from the query (InvalidArgument
    naming the parameter)."""
    raw = query.get("limit", str(DEFAULT_LIMIT))
    try:
        limit = int(raw)
    except ValueError:
        raise InvalidArgument("limit", f"must be an integer, got {raw!r}") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument("limit", f"must be in [1, {MAX_LIMIT}], got {limit}")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidArgument("order", f"must be asc or desc, got {order!r}")
    return query.get("after"), limit, order == "asc"


def page(items: Sequence[Json], after: str | None, limit: int, ascending: bool) -> Json:
    """One page of `items` (in the order they were read) in OpenAI's list layout."""
    ordered = list(items) if ascending else list(reversed(items))
    start = 0
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise InvalidArgument("after", f"no item {after!r} among this response's input items")
        start = ids.index(after) + 1
    data = ordered[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
    }
