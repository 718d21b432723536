"""A copy-heavy prompt set for speculative decoding: tasks whose answer repeats much of
the prompt (rewrite, edit, extraction, JSON with long strings), where drafting from the
prompt pays. Each task is a chat message; the texts are written for this set.

`TASKS` is what `bench/speculative.py` runs and what the engine tests sample from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    kind: str  # rewrite | edit | extract | json
    prompt: str


_HARBOR = (
    "The old harbor town wakes before dawn. Fishing boats leave the breakwater one by one, "
    "their lamps swinging over the dark water, while the bakery on the quay lights its ovens "
    "and the first bus of the day waits by the fountain. By seven the market stalls are up, "
    "the ferry to the islands has sounded its horn twice, and the school children walk along "
    "the sea wall in small noisy groups."
)
_LIBRARY = (
    "The city library opens at nine on weekdays and at ten on Saturdays. Members may borrow "
    "up to twelve books at a time for three weeks, and renew each loan twice online. The "
    "reading room on the second floor is silent, the children's corner on the ground floor "
    "is not, and the café next to the entrance closes one hour before the library does."
)
_CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def cheapest_item(items):
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best
"""
_CONFIG = """server:
  host: 0.0.0.0
  port: 8080
  workers: 4
cache:
  size_mb: 512
  ttl_seconds: 300
logging:
  level: info
  file: /var/log/app.log
"""
_PEOPLE = (
    "Ada Moreno is a structural engineer in Lisbon who designs footbridges. Tomas Berg is a "
    "marine biologist in Bergen who studies cold-water corals. Priya Nair is a pastry chef in "
    "Kochi who runs a small bakery near the backwaters. Lena Fischer is a violin maker in "
    "Mittenwald who restores old instruments."
)
_REVIEW = (
    "I bought this kettle in March. It boils a full litre in about three minutes, the handle "
    "stays cool, and the lid opens with one finger. The only problem is the cord, which is "
    "too short to reach the socket behind my toaster. Overall it is a solid kettle for the "
    "price and I would buy it again."
)

TASKS: tuple[Task, ...] = (
    Task("rewrite", f"Repeat the following text exactly, word for word.\n\n{_HARBOR}"),
    Task(
        "rewrite",
        f"Rewrite the following text, changing only 'harbor' to 'port'.\n\n{_HARBOR}",
    ),
    Task(
        "rewrite",
        f"Copy this notice exactly, then add one sentence about parking.\n\n{_LIBRARY}",
    ),
    Task(
        "edit",
        f"Rename the variable `subtotal` to `net` in this code. Output the whole code.\n\n"
        f"```python\n{_CODE}```",
    ),
    Task(
        "edit",
        f"Add a docstring to each function in this code and output the whole code.\n\n"
        f"```python\n{_CODE}```",
    ),
    Task(
        "edit",
        f"Change the port to 9090 and the log level to debug. Output the whole file.\n\n"
        f"```yaml\n{_CONFIG}```",
    ),
    Task(
        "extract",
        f"List every sentence of this text that mentions a time, one per line, "
        f"copied exactly.\n\n{_LIBRARY}",
    ),
    Task("extract", f"Quote the sentences of this review that describe a problem.\n\n{_REVIEW}"),
    Task(
        "extract",
        f"For each person in this text, copy the sentence that describes them.\n\n{_PEOPLE}",
    ),
    Task(
        "json",
        "Return a JSON list of objects with the keys name, city and description (the whole "
        f"sentence about the person, copied).\n\n{_PEOPLE}",
    ),
    Task(
        "json",
        'Return JSON {"summary": ..., "text": ...} where text is the review copied exactly.'
        f"\n\n{_REVIEW}",
    ),
    Task(
        "json",
        f"Convert this file to JSON, keeping every key and value.\n\n```yaml\n{_CONFIG}```",
    ),
)
