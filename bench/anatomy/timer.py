"""`PhaseTimer`: host wall time per phase of an engine step, from wrapped callables.

Its own module because both `bench/step_anatomy.py` (batch1, json) and
`bench/anatomy/prefill.py` (the prefill workload, which `step_anatomy` imports) time
phases with it: kept in `step_anatomy`, prefill had to import it back, an import cycle.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any


class PhaseTimer:
    """Wall time of wrapped callables, per phase name, for the current step."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)

    def wrap(self, obj: Any, name: str, phase: str) -> None:
        fn: Callable[..., Any] = getattr(obj, name)

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.current[phase] += time.perf_counter() - t0

        setattr(obj, name, timed)

    def take(self) -> dict[str, float]:
        out = {k: 1e3 * v for k, v in self.current.items()}
        self.current = defaultdict(float)
        return out
