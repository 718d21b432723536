"""The worker's periodic stats line while it serves (the `--log-stats-interval` option)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from radixmesh.worker.stats import SchedulerStats

if TYPE_CHECKING:
    from radixmesh.worker.serving_engine import ServingEngine

logger = logging.getLogger(__name__)


async def log_stats(engine: ServingEngine, interval: float) -> None:
    """`engine`: an Engine or an EngineProcess (its `get_stats`).

    Every `interval` seconds a line of what the worker does, when it changed (an idle
    worker logs once): running and waiting requests, generation throughput, KV use and
    the prefix cache's hit rate."""
    if interval <= 0:
        return
    last_line = ""
    prev: SchedulerStats | None = None
    prev_t = time.monotonic()
    while True:
        await asyncio.sleep(interval)
        s: SchedulerStats = await asyncio.to_thread(engine.get_stats)
        now = time.monotonic()
        generated = s.generated_tokens - (prev.generated_tokens if prev else 0)
        line = (
            f"running {s.num_running}, waiting {s.num_waiting}, "
            f"generation {generated / (now - prev_t):.1f} tokens/s, "
            f"KV {100 * s.kv_slots_used / max(s.kv_slots_total, 1):.1f}% "
            f"({s.kv_slots_used}/{s.kv_slots_total} tokens), "
            f"prefix cache hit rate {100 * s.cache_hit_rate:.1f}%"
        )
        if line != last_line:
            logger.info("stats: %s", line)
            last_line = line
        prev, prev_t = s, now
