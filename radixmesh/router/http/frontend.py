"""What the HTTP route modules use of the router's HTTP front end, as a Protocol.

`http.py`'s `HttpFrontend` builds the aiohttp app and registers the OpenAI routes
(`openai/routes.py`) and SGLang's native API (`sglang_api.py`) on it; they call back
into it for the model, the configuration and the one generation path. Typing them
against this Protocol instead of the class keeps the imports one-way (http -> routes).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Protocol

from radixmesh.v1 import common_pb2

if TYPE_CHECKING:
    from aiohttp import web

    from radixmesh.router.config import RouterConfig
    from radixmesh.router.control import ControlPlane
    from radixmesh.router.dispatch import Dispatcher
    from radixmesh.router.programs import ProgramHint
    from radixmesh.tokenizer import TokenizerLike

# (output index, serving worker id, chunk)
JobChunks = AsyncGenerator[tuple[int, str, common_pb2.GenerateChunk], None]
# (output index, token ids, sampling parameters)
Job = tuple[int, list[int], common_pb2.SamplingParams]


class Frontend(Protocol):
    dispatch: Dispatcher  # the one generation path (admission, rate, workers' chunks)
    control: ControlPlane  # the workers, the served model
    config: RouterConfig
    grpc_port: int | None  # the router's gRPC port (SGLang clients read it)

    def ready(self) -> tuple[TokenizerLike, common_pb2.ModelInfo]:
        """The tokenizer and model info; Unavailable until a worker has answered."""
        ...

    def check_model(self, name: str) -> None:
        """An ApiError 404 naming `model` unless `name` is the served model."""
        ...

    def operator(self, request: web.Request) -> bool:
        """Whether the caller may see the router's internals (which worker served)."""
        ...

    def stream_jobs(
        self,
        jobs: list[Job],
        rid: str,
        *,
        stream: bool,
        rids: list[str] | None = None,
        hint: ProgramHint | None = None,
        caller: str = "",
    ) -> JobChunks:
        """Every job's chunks as (index, worker id, chunk), the jobs generated at once,
        under `caller`'s request ids (auth.caller_of its key)."""
        ...
