"""Reading a server-sent event stream the way a plain SSE client does, for the resumable
stream tests: each event's id, name and data, up to a count or the stream's end (or its
cut, when the router serving it dies)."""

from __future__ import annotations

import http.client
from typing import Any

Event = tuple[str | None, str | None, str]  # (id, event name, data)


def read_events(resp: Any, until: int | None = None) -> list[Event]:
    """(id, name, data) of the SSE events read from `resp` (`until`: stop after that many)."""
    events: list[Event] = []
    event_id: str | None = None
    name: str | None = None
    data: str | None = None
    while until is None or len(events) < until:
        try:
            line = resp.readline()
        except (http.client.IncompleteRead, ConnectionError):
            break  # the router died mid-event
        if not line:
            break
        text = line.decode().rstrip("\n")
        if text.startswith("data: "):
            data = text[6:]
        elif text.startswith("id: "):
            event_id = text[4:]
        elif text.startswith("event: "):
            name = text[7:]
        elif not text and data is not None:
            events.append((event_id, name, data))
            event_id, name, data = None, None, None
    return events
