"""ProgramTable: a program's requests stay on its worker while that worker's load allows."""

from __future__ import annotations

from radixmesh.router.policy import Candidate
from radixmesh.router.programs import ProgramHint, ProgramTable

HINT = ProgramHint("batch-1", shared_prefix_tokens=40)


def workers(queued_a: int, queued_b: int, healthy_a: bool = True) -> list[Candidate]:
    return [Candidate("a", healthy_a, 40, queued_a), Candidate("b", True, 0, queued_b)]


def test_a_placed_program_stays_while_its_worker_has_room() -> None:
    table = ProgramTable(max_queued=4)
    assert table.home(HINT, workers(0, 0)) is None  # not placed yet: the policy decides
    table.placed(HINT, "a")
    assert table.home(HINT, workers(3, 0)) == "a"  # busier than b, kept with its prefix
    assert table.home(HINT, workers(4, 0)) is None  # full: the policy places it
    table.placed(HINT, "b")  # and the program follows
    assert table.home(HINT, workers(0, 1)) == "b"
    assert table.home(HINT, workers(0, 1)) == "b" and table.kept == 3


def test_unhealthy_untagged_and_prefixless_requests_go_to_the_policy() -> None:
    table = ProgramTable(max_queued=4)
    table.placed(HINT, "a")
    assert table.home(HINT, workers(0, 0, healthy_a=False)) is None
    assert table.home(None, workers(0, 0)) is None
    empty = ProgramHint("batch-2", shared_prefix_tokens=0)
    table.placed(empty, "a")
    assert table.home(empty, workers(0, 0)) is None and len(table) == 1


def test_the_table_forgets_the_least_recently_used_program() -> None:
    table = ProgramTable(max_queued=4, capacity=2)
    for name in ("p1", "p2", "p3"):
        table.placed(ProgramHint(name, 1), "a")
    assert len(table) == 2
    assert table.home(ProgramHint("p1", 1), workers(0, 0)) is None
    assert table.home(ProgramHint("p3", 1), workers(0, 0)) == "a"
