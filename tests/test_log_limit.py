"""log_limit.py: a burst of lines per place per interval, the rest counted into one line."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from radixmesh.log_limit import RateLimit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO, RateLimit, Clock]]:
    clock = Clock()
    limit = RateLimit(interval=10.0, burst=3, clock=clock)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    second = logging.StreamHandler(io.StringIO())  # a second handler: one verdict a record
    for h in (handler, second):
        h.addFilter(limit)
    root = logging.getLogger()
    for h in (handler, second):
        root.addHandler(h)
    log = logging.getLogger("flood.source")
    old_level = log.level
    log.setLevel(logging.INFO)
    try:
        yield log, out, limit, clock
    finally:
        log.setLevel(old_level)
        for h in (handler, second):
            root.removeHandler(h)


def _boom(log: logging.Logger, i: int) -> None:
    try:
        raise ValueError(f"bad call {i}")
    except ValueError:
        log.exception("call %d failed", i)  # one place: this line


_BOOM_LINE = _boom.__code__.co_firstlineno + 4  # the log.exception line: the place


def test_a_burst_then_one_count_line(
    logged: tuple[logging.Logger, io.StringIO, RateLimit, Clock],
) -> None:
    log, out, _, clock = logged
    for i in range(500):
        _boom(log, i)
    lines = out.getvalue().splitlines()
    assert [line for line in lines if line.startswith("flood.source")] == [
        "flood.source ERROR call 0 failed",
        "flood.source ERROR call 1 failed (traceback as above, not repeated)",
        "flood.source ERROR call 2 failed (traceback as above, not repeated)",
    ]
    assert sum("Traceback" in line for line in lines) == 1
    assert "ValueError: bad call 0" in out.getvalue()
    clock.now += 10.0  # the interval ends: the next record brings the count first
    _boom(log, 500)
    lines = out.getvalue().splitlines()
    count = next(line for line in lines if "were not logged" in line)
    assert count == (
        "radixmesh.log_limit WARNING 497 more lines like this one in 10 s were not logged "
        f"(flood.source, test_log_limit.py:{_BOOM_LINE}): call 3 failed"
    )
    assert lines[-1] == "ValueError: bad call 500"  # a new interval: its traceback again
    assert sum("were not logged" in line for line in lines) == 1


def test_places_are_counted_apart_and_flushed(
    logged: tuple[logging.Logger, io.StringIO, RateLimit, Clock],
) -> None:
    log, out, limit, _ = logged
    for i in range(5):
        log.info("first place %d", i)
        log.info("second place %d", i)
    other = logging.getLogger("flood.other")
    other.warning("quiet place")
    text = out.getvalue()
    assert [f"first place {i}" in text for i in range(5)] == [True] * 3 + [False] * 2
    assert [f"second place {i}" in text for i in range(5)] == [True] * 3 + [False] * 2
    assert "quiet place" in text
    limit.flush()  # at exit: every count that is left
    counts = [line for line in out.getvalue().splitlines() if "were not logged" in line]
    assert [c.split(" more lines")[0].split()[-1] for c in counts] == ["2", "2"]
    limit.flush()
    assert sum("were not logged" in line for line in out.getvalue().splitlines()) == 2


def test_a_count_comes_without_another_record(
    logged: tuple[logging.Logger, io.StringIO, RateLimit, Clock],
) -> None:
    log, out, limit, clock = logged
    for i in range(4):
        log.warning("burst %d", i)
    limit.report_due()  # the interval has not ended: nothing yet
    assert "were not logged" not in out.getvalue()
    clock.now += 10.0
    limit.report_due()  # what configure's thread does every interval
    assert (
        out.getvalue()
        .splitlines()[-1]
        .startswith(
            "radixmesh.log_limit WARNING 1 more lines like this one in 10 s were not logged"
        )
    )


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="interval must be > 0"):
        RateLimit(interval=0)
    with pytest.raises(ValueError, match="burst >= 1"):
        RateLimit(burst=0)


def test_configure_limits_a_process_and_counts_at_exit() -> None:
    script = (
        "import logging\n"
        "from radixmesh import log_limit\n"
        "limit = log_limit.configure()\n"
        "assert log_limit.configure() is limit  # once per process\n"
        "for i in range(20):\n"
        "    logging.getLogger('flood').error('junk %d', i)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    lines = [line.split(" ", 2)[2] for line in done.stderr.splitlines()]  # no timestamps
    assert lines == [
        *(f"ERROR flood: junk {i}" for i in range(5)),
        "WARNING radixmesh.log_limit: 15 more lines like this one in 10 s were not logged "
        "(flood, <string>:6): junk 5",
    ]
