"""What the worker's servers need of an engine: the interface that the in-process `Engine`
(engine.py) and the child-process `EngineProcess` (engine_process.py) both provide.

The gRPC server, its serving loop, the cache-event hub and the stats log take a
`ServingEngine`; mypy checks each implementation against it where one is built
(`serving.py`), so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from radixmesh.worker.config import EngineConfig
from radixmesh.worker.engine_info import EngineInfo
from radixmesh.worker.kvcache.events import CacheEvent, CacheListener
from radixmesh.worker.request_output import Delivery, RequestOutput


class ServingEngine(Protocol):
    @property
    def config(self) -> EngineConfig: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def info(self) -> EngineInfo: ...

    @property
    def draining(self) -> bool: ...

    @property
    def fatal(self) -> str | None:
        """Why the engine stopped serving; None while it serves."""
        ...

    def async_stream(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        rid: str | None = None,
        delivery: Delivery = Delivery.STEPS,
    ) -> AsyncIterator[RequestOutput]:
        """One request's outputs (each step's, or those `delivery` names); a bad request
        raises at once or at the first step."""
        ...

    async def async_encode(
        self, input_ids: list[int], pooling: str = "mean", rid: str | None = None
    ) -> RequestOutput: ...

    async def async_score(
        self, input_ids: list[int], continuations: list[list[int]]
    ) -> list[list[float]]: ...

    def abort(self, rid: str) -> None: ...

    def abort_all(self, reason: str = "aborted") -> None: ...

    def flush_cache(self) -> bool: ...

    def get_stats(self) -> Any: ...

    def drain(self) -> None: ...

    def add_cache_listener(self, fn: CacheListener) -> object:
        """`fn` gets every cache event, in order, on a thread of the engine's."""
        ...

    def cache_snapshot(self, stamp: Callable[[], int]) -> tuple[int, list[CacheEvent]]: ...

    def shutdown(self) -> None: ...
