"""How many lines one place in the code may log: a burst, then a count per interval.

Any line a client can make a server write, it can make the server write a million times:
gRPC logs an ERROR with a traceback for every call whose metadata is not UTF-8 (500 such
calls with a 4 KB junk `authorization` value added 1.16 MB to a worker's log), aiohttp
one per malformed request, and our own code a warning per refused request here and
there. Finding each such line is a hunt that never ends, so the limit is on every line:
`RateLimit` is a filter on the process's handlers (`configure` puts it there) that lets
through at most `burst` records from one place (logger, file and line) per `interval`
seconds, the first of them with its traceback and the others without, and counts the
rest. The count is written as one line once the interval ended: when the place logs
again, when any record comes through, within another interval at the latest (a thread
looks), and at exit:

    WARNING radixmesh.log_limit: 1,995 more lines like this one in 10 s were not logged
    (grpc._cython.cygrpc, events.py:80): Invalid encoding on ***

(A place is the innermost Python frame: gRPC's Cython code logs from asyncio's.)

A place that logs less than `burst` lines an interval (nearly all of them: start and
stop, a worker joining, a stats line every 10 s) is not touched.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from radixmesh.redact import clip

INTERVAL = 10.0  # seconds
BURST = 5  # records per place per interval
MAX_PLACES = 4096  # places tracked at once; past it the oldest interval is forgotten
_DECIDED = "_radixmesh_rate_limited"  # record attribute: this filter's verdict, once
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

logger = logging.getLogger(__name__)


@dataclass
class _Place:
    start: float  # when its interval began
    passed: int = 0  # records let through in this interval
    dropped: int = 0  # records not logged in this interval
    sample: str = field(default="")  # the first dropped record's first line


class RateLimit(logging.Filter):
    """At most `burst` records per place per `interval` seconds (the module's doc). Put
    one instance on every handler: a record is judged once, whichever handler sees it
    first, and the others follow the verdict."""

    def __init__(
        self,
        interval: float = INTERVAL,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        if interval <= 0 or burst < 1:
            raise ValueError(f"interval must be > 0 and burst >= 1, got {interval}, {burst}")
        self.interval = interval
        self.burst = burst
        self.clock = clock
        self._places: dict[tuple[str, str, int], _Place] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # .reporting: this thread logs a count (unjudged)

    def filter(self, record: logging.LogRecord) -> bool:
        verdict = getattr(record, _DECIDED, None)
        if verdict is None:
            verdict = self._judge(record)
            setattr(record, _DECIDED, verdict)
        return bool(verdict)

    def flush(self) -> None:
        """Log the counts of every place that dropped records (at exit, in tests)."""
        with self._lock:
            done = self._expire(float("inf"))
        self._report(done)

    def report_due(self) -> None:
        """Log the counts of the places whose interval ended (`configure`'s thread calls
        this every interval, so a count comes even when nothing else is logged)."""
        with self._lock:
            done = self._expire(self.clock())
        self._report(done)

    def _judge(self, record: logging.LogRecord) -> bool:
        if getattr(self._local, "reporting", False):
            return True
        now = self.clock()
        key = (record.name, os.path.basename(record.pathname), record.lineno)
        with self._lock:
            done = self._expire(now)
            place = self._places.get(key)
            if place is None:
                if len(self._places) >= MAX_PLACES:
                    self._places.pop(next(iter(self._places)))
                place = self._places[key] = _Place(now)
            keep = place.passed < self.burst
            if keep:
                place.passed += 1
                if place.passed > 1 and (record.exc_text or record.exc_info):
                    record.exc_text, record.exc_info = None, None  # one traceback an interval
                    record.msg = f"{record.msg} (traceback as above, not repeated)"
            else:
                place.dropped += 1
                if not place.sample:
                    place.sample = clip(_message(record).split("\n", 1)[0], 200)
        self._report(done)
        return keep

    def _expire(self, now: float) -> list[tuple[tuple[str, str, int], _Place]]:
        """Forget the places whose interval ended; those that dropped records, returned."""
        ended = [k for k, p in self._places.items() if now >= p.start + self.interval]
        out = []
        for key in ended:
            place = self._places.pop(key)
            if place.dropped:
                out.append((key, place))
        return out

    def _report(self, done: list[tuple[tuple[str, str, int], _Place]]) -> None:
        if not done:
            return
        self._local.reporting = True
        try:
            for (name, file, line), place in done:
                logger.warning(
                    "%s more lines like this one in %g s were not logged (%s, %s:%d): %s",
                    f"{place.dropped:,}",
                    self.interval,
                    name,
                    file,
                    line,
                    place.sample,
                )
        finally:
            self._local.reporting = False


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a bad format string: its template will do
        return str(record.msg)


def configure(level: int = logging.INFO, limit: RateLimit | None = None) -> RateLimit:
    """The process's logging: records of `level` and up to stderr in FORMAT, every root
    handler behind one `RateLimit` (its counts flushed at exit). For a server's `main`;
    redaction is installed where the keys are known (redact.install). Once per process:
    a second call returns the first one's limit."""
    logging.basicConfig(level=level, format=FORMAT, stream=sys.stderr)
    handlers = logging.getLogger().handlers
    present = [f for h in handlers for f in h.filters if isinstance(f, RateLimit)]
    if present:  # configured already (a second call in one process)
        return present[0]
    limit = limit if limit is not None else RateLimit()
    for handler in handlers:
        handler.addFilter(limit)
    atexit.register(limit.flush)
    threading.Thread(target=_report_every_interval, args=(limit,), daemon=True).start()
    return limit


def _report_every_interval(limit: RateLimit) -> None:
    while True:
        time.sleep(limit.interval)
        limit.report_due()
