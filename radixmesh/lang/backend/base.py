"""The backend interface: what the interpreter asks of a model provider.

A backend turns a program state's context (its text, or its messages for chat APIs)
into generations and choice scores. Calls may come from many executor threads at once;
implementations must be thread-safe.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from radixmesh.client.types import ProgramHint
from radixmesh.lang.chat_template import ChatTemplate
from radixmesh.lang.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    TokenLogprob,
    normalized_logprob,
)


@dataclass(frozen=True)
class Context:
    """What a backend sees of a program state at a model call."""

    text: str
    messages: list[dict[str, str]]
    role: str | None  # the role being written, None outside roles
    role_text: str  # text written since that role began
    program: ProgramHint | None = None  # the fork / batch the state belongs to, if any


GenResult = tuple[str | list[str], dict[str, Any]]
T = TypeVar("T")
# Blocking calls of backends without native asyncio (HTTP API clients): a bounded pool,
# so many programs waiting on such a backend share these threads.
BLOCKING_CALL_THREADS = 64
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in the shared pool of threads for blocking backend calls."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(BLOCKING_CALL_THREADS, thread_name_prefix="radixmesh-call")
    return await asyncio.get_running_loop().run_in_executor(_pool, fn, *args)


class Backend(ABC):
    """A model provider. `params` use the engine's sampling-parameter names.

    The interpreter calls the `a`-methods, on an event loop. By default they run the
    blocking methods in a shared pool of threads; backends with an asyncio client (the
    engine, the cluster) override them and use no thread."""

    chat_template: ChatTemplate
    # Speaks messages, not text: a gen must start an assistant turn (see speculative.py).
    is_chat_model = False

    @abstractmethod
    def generate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        """Text (a list when n > 1) and its meta_info."""

    def generate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Text deltas with meta_info; the default streams the whole result as one delta."""
        text, meta = self.generate(ctx, params)
        yield (text if isinstance(text, str) else text[0]), meta

    def score(
        self, ctx: Context, choices: list[str], unconditional: bool
    ) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
        """Logprobs of each choice's tokens after the context (and alone, if asked)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot score choices, so select is not supported"
        )

    def select(
        self,
        ctx: Context,
        choices: list[str],
        temperature: float,
        method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        cond, uncond = self.score(ctx, choices, method.requires_unconditional_logprobs)
        return _decide(method, choices, cond, uncond)

    async def agenerate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        return await in_thread(self.generate, ctx, params)

    async def agenerate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """`generate_stream`'s deltas, read in a pool thread and handed to the loop."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[tuple[str, dict[str, Any]] | None, BaseException | None]]
        queue = asyncio.Queue()

        def pump() -> None:
            try:
                for item in self.generate_stream(ctx, params):
                    loop.call_soon_threadsafe(queue.put_nowait, (item, None))
                loop.call_soon_threadsafe(queue.put_nowait, (None, None))
            except BaseException as e:
                loop.call_soon_threadsafe(queue.put_nowait, (None, e))

        pumping = asyncio.ensure_future(in_thread(pump))
        while True:
            item, error = await queue.get()
            if error is not None:
                raise error
            if item is None:
                break
            yield item
        await pumping

    async def ascore(
        self, ctx: Context, choices: list[str], unconditional: bool
    ) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
        return await in_thread(self.score, ctx, choices, unconditional)

    async def aselect(
        self,
        ctx: Context,
        choices: list[str],
        temperature: float,
        method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        cond, uncond = await self.ascore(ctx, choices, method.requires_unconditional_logprobs)
        return _decide(method, choices, cond, uncond)

    async def acache_prefix(self, text: str, program: ProgramHint | None = None) -> None:
        await in_thread(self.cache_prefix, text, program)

    def cache_prefix(self, text: str, program: ProgramHint | None = None) -> None:  # noqa: B027
        """Prefill `text` so later requests that start with it hit the cache."""

    def program_hint(self, prefix: str) -> ProgramHint | None:
        """A new program id for requests that share `prefix` (a fork's branches, a
        batch), for backends whose router places programs (None: no such thing)."""
        return None

    def flush_cache(self) -> bool:
        return False

    def get_server_info(self) -> dict[str, Any]:
        """What serves the backend's requests (SGLang's server info, where there is one)."""
        return {"backend": type(self).__name__}

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend owns."""


def _decide(
    method: ChoicesSamplingMethod,
    choices: list[str],
    cond: list[list[TokenLogprob]],
    uncond: list[list[TokenLogprob]] | None,
) -> ChoicesDecision:
    return method(
        choices=choices,
        normalized_prompt_logprobs=[normalized_logprob(c) for c in cond],
        input_token_logprobs=cond,
        output_token_logprobs=[[] for _ in choices],
        unconditional_token_logprobs=uncond,
    )
