"""A per-worker circuit breaker: stop sending to a worker that keeps failing.

closed --(`failures` consecutive failures)--> open --(`cooldown` seconds)--> half_open;
half_open lets trial requests through: a success closes it, a failure opens it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    def __init__(
        self, failures: int, cooldown: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = failures
        self.cooldown = cooldown
        self.clock = clock
        self.consecutive_failures = 0
        self._opened_at: float | None = None

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return "closed"
        return "half_open" if self.clock() - self._opened_at >= self.cooldown else "open"

    def allows(self) -> bool:
        # A closed breaker answers without `state` (asked per worker per routing decision).
        return self._opened_at is None or self.state != "open"

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self._opened_at = None

    def record_failure(self) -> None:
        self.consecutive_failures += 1
        if self.state == "half_open" or self.consecutive_failures >= self.threshold:
            self._opened_at = self.clock()
