"""The in-process backend: a `radixmesh.Engine` in this Python process.

`select` scores every choice with prompt logprobs (`scoring.py`, shared with the cluster
backend); here all of a select's scoring requests go to the engine as one batch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from radixmesh.errors import InvalidArgument
from radixmesh.lang.backend.base import Backend, Context, GenResult
from radixmesh.lang.backend.scoring import (
    PREFILL_PARAMS,
    ascore_choices,
    score_choices,
    score_params,
)
from radixmesh.lang.backend.scoring import check_finished as _check
from radixmesh.lang.chat_template import ChatTemplate
from radixmesh.lang.choices import TokenLogprob

if TYPE_CHECKING:
    from radixmesh.client.types import ProgramHint
    from radixmesh.worker.engine import Engine


class EngineBackend(Backend):
    """`EngineBackend(engine)` wraps an engine; `EngineBackend(model=..., **options)` owns one."""

    def __init__(self, engine: Engine | None = None, model: str = "smollm2", **options: Any):
        if engine is None:
            from radixmesh.worker.engine import Engine

            engine = Engine(model, **options)
            self._owns = True
        else:
            self._owns = False
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.chat_template = ChatTemplate.from_tokenizer(engine.tokenizer)

    def generate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        return _result(self.engine.generate(ctx.text, params))

    async def agenerate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        return _result(await self.engine.async_generate(ctx.text, params))

    async def agenerate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        if params.get("n", 1) != 1:
            raise InvalidArgument("n", "streaming generates one completion (n=1)")
        stream = await self.engine.async_generate(ctx.text, params, stream=True)
        assert isinstance(stream, AsyncIterator)
        async for chunk in stream:
            yield chunk["text"], _check(chunk["meta_info"])

    def generate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        if params.get("n", 1) != 1:
            raise InvalidArgument("n", "streaming generates one completion (n=1)")
        stream = self.engine.generate(ctx.text, params, stream=True)
        assert isinstance(stream, Iterator)
        for chunk in stream:
            yield chunk["text"], _check(chunk["meta_info"])

    def score(
        self, ctx: Context, choices: list[str], unconditional: bool
    ) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
        return score_choices(self.tokenizer, ctx.text, choices, unconditional, self._logprobs)

    async def ascore(
        self, ctx: Context, choices: list[str], unconditional: bool
    ) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
        return await ascore_choices(
            self.tokenizer, ctx.text, choices, unconditional, self._alogprobs
        )

    def _logprobs(
        self, ids: list[list[int]], starts: list[int]
    ) -> list[list[tuple[float | None, int]]]:
        """One batched engine call for every scoring request."""
        params = [score_params(s) for s in starts]
        return _entries(self.engine.generate(input_ids=ids, sampling_params=params))

    async def _alogprobs(
        self, ids: list[list[int]], starts: list[int]
    ) -> list[list[tuple[float | None, int]]]:
        params = [score_params(s) for s in starts]
        return _entries(await self.engine.async_generate(input_ids=ids, sampling_params=params))

    def cache_prefix(self, text: str, program: ProgramHint | None = None) -> None:
        if text:
            self.engine.generate(text, dict(PREFILL_PARAMS))

    async def acache_prefix(self, text: str, program: ProgramHint | None = None) -> None:
        if text:
            await self.engine.async_generate(text, dict(PREFILL_PARAMS))

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        import dataclasses

        stats = self.engine.get_stats()
        return {
            "model_path": self.engine.config.model.model,
            "context_length": self.engine.worker.context_len,
            **dataclasses.asdict(self.engine.config),
            "stats": vars(stats) if hasattr(stats, "__dict__") else stats,
        }

    def shutdown(self) -> None:
        if self._owns:
            self.engine.shutdown()


def _result(out: Any) -> GenResult:
    if isinstance(out, list):  # n > 1
        for o in out:
            _check(o["meta_info"])
        return [o["text"] for o in out], {"choices": [o["meta_info"] for o in out]}
    assert isinstance(out, dict)
    return out["text"], _check(out["meta_info"])


def _entries(outs: Any) -> list[list[tuple[float | None, int]]]:
    assert isinstance(outs, list)
    return [
        [(lp, tid) for lp, tid, _ in _check(o["meta_info"])["input_token_logprobs"]] for o in outs
    ]
