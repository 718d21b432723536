"""The router's real HTTP front end, in-process and without workers, for the tests of
what it answers on its own: validation errors, /openapi.json, /tokenize, /detokenize.

It runs on its own event loop in a thread. The control plane knows the model (the tokenizer and
ModelInfo a worker would have sent) but has no reachable worker, so a request that passes
validation and reaches routing gets 503.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from radixmesh.router.config import RouterConfig
from radixmesh.router.control import ControlPlane
from radixmesh.router.dispatch import Dispatcher
from radixmesh.router.http.app import HttpFrontend
from radixmesh.router.metrics import RouterMetrics
from radixmesh.router.pool import WorkerPool
from radixmesh.tokenizer import TokenizerLike
from radixmesh.v1 import common_pb2
from tests.router.http_helpers import Http


class Frontend:
    def __init__(
        self, tokenizer: TokenizerLike, model: str, *, context_length: int = 2048, **config: Any
    ) -> None:
        self.tokenizer = tokenizer
        self.info = common_pb2.ModelInfo(
            model=model, context_length=context_length, vocab_size=tokenizer.vocab_size
        )
        self.config = RouterConfig(workers=("127.0.0.1:9",), **config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = self._run(self._start())
        self.http = Http(self.port)
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def _start(self) -> int:
        self.pool = WorkerPool(self.config)
        metrics = RouterMetrics(self.pool)
        control = ControlPlane(self.config, self.pool, metrics)
        control.tokenizer = self.tokenizer
        control.model_info = self.info
        dispatch = Dispatcher(self.config, control, metrics)
        self.frontend = HttpFrontend(dispatch, control, self.config)
        return await self.frontend.start("127.0.0.1", 0)

    async def _stop(self) -> None:
        await self.frontend.stop()
        await self.pool.close()

    def close(self) -> None:
        self._run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
