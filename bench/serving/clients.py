"""The benchmark's clients: one streamed request in, one `RequestResult` out.

Three backends, measured the same way (SGLang's `bench_serving` definitions):
- `openai-completions` / `openai-chat`: the router's OpenAI HTTP API over aiohttp, SSE
  streaming with `stream_options.continuous_usage_stats`, so every event carries the
  running token count (a token that decodes to no text still counts; `dummy:` models
  sample many of those) and the usage with `cached_tokens`;
- `grpc`: the SDK's `AsyncClient` against a router or a worker (chunks carry token ids);
- `grpc-unary`: the same SDK call without streaming (one reply per request: TTFT is E2E).

`grpc-direct` / `grpc-unary-direct` send the same gRPC load straight to the workers
(`Spread`: request i to worker i mod W), as a client that knew every worker would: the
router tier's cost is the difference to the load through the router.

TTFT is the time from sending to the first chunk that carries a token; ITL the time
between successive token-carrying chunks (one sample per chunk, as SGLang counts it);
E2E the time to the last byte.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from bench.serving.workloads import Prompt

WORKER_HEADER = "X-Radixmesh-Worker"


@dataclass
class RequestResult:
    start: float = 0.0  # seconds since the run began, when the request was sent
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    ideal_cached: int = 0
    worker: str = ""
    error: str = ""  # empty: succeeded; else the failure's kind (an HTTP status or gRPC code)
    detail: str = ""  # the failure's message
    reply_ids: list[int] = field(default_factory=list)
    reply_text: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


class Backend(Protocol):
    name: str
    gives_ids: bool  # replies come back as token ids (multi-turn over ids needs them)

    async def send(self, prompt: Prompt, max_tokens: int, result: RequestResult) -> None:
        """Stream one request, filling `result` (timings relative to the call)."""

    async def close(self) -> None: ...


class _Clock:
    def __init__(self, result: RequestResult) -> None:
        self.result = result
        self.sent = time.perf_counter()
        self.last = 0.0

    def tokens(self, n: int) -> None:
        """A chunk that brought `n` tokens arrived now."""
        if n <= 0:
            return
        now = time.perf_counter()
        if self.last == 0.0:
            self.result.ttft = now - self.sent
        else:
            self.result.itl.append(now - self.last)
        self.last = now

    def done(self) -> None:
        self.result.e2e = time.perf_counter() - self.sent


class OpenAIBackend:
    """POST /v1/completions or /v1/chat/completions, streamed."""

    gives_ids = False

    def __init__(self, base_url: str, model: str, *, chat: bool, api_key: str | None = None):
        self.name = "openai-chat" if chat else "openai-completions"
        self.chat = chat
        self.url = base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No connection cap: an open-loop benchmark must not queue in its own client.
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=600),
        )

    def body(self, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.chat:
            if not isinstance(prompt, str):
                raise ValueError("prompt: the chat endpoint takes text prompts")
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    async def send(self, prompt: Prompt, max_tokens: int, result: RequestResult) -> None:
        clock = _Clock(result)
        text: list[str | None] = []  # a chat delta without content adds None
        try:
            async with self.session.post(
                self.url, json=self.body(prompt, max_tokens), headers=self.headers
            ) as resp:
                result.worker = resp.headers.get(WORKER_HEADER, "")
                if resp.status != 200:
                    result.error = f"http_{resp.status}"
                    result.detail = (await resp.read()).decode(errors="replace")[:500]
                    return
                seen = 0
                async for line in resp.content:
                    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        result.error = str(event["error"].get("code") or "stream_error")
                        result.detail = str(event["error"].get("message", ""))[:500]
                        continue
                    usage = event.get("usage")
                    if usage:
                        clock.tokens(usage["completion_tokens"] - seen)
                        seen = usage["completion_tokens"]
                        result.prompt_tokens = usage["prompt_tokens"]
                        details = usage.get("prompt_tokens_details") or {}
                        result.cached_tokens = details.get("cached_tokens", 0)
                    for choice in event.get("choices", ()):
                        piece = choice.get("delta", {}).get("content") if self.chat else None
                        text.append(piece if self.chat else choice.get("text", ""))
                result.output_tokens = seen
        except (aiohttp.ClientError, TimeoutError) as e:
            result.error = type(e).__name__
            result.detail = str(e)[:500]
        finally:
            clock.done()
            result.reply_text = "".join(t for t in text if t)

    async def close(self) -> None:
        await self.session.close()


class GrpcBackend:
    """The SDK's `generate` against a router (or a worker: then no worker id), streamed or
    (`stream=False`) as one reply."""

    gives_ids = True

    def __init__(
        self, target: str, *, api_key: str | None = None, stream: bool = True, connections: int = 1
    ) -> None:
        from radixmesh.client import AsyncClient

        self.name = "grpc" if stream else "grpc-unary"
        self.stream = stream
        self.client = AsyncClient(target, api_key=api_key, max_retries=0, connections=connections)

    async def send(self, prompt: Prompt, max_tokens: int, result: RequestResult) -> None:
        import grpc

        params = {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
        clock = _Clock(result)
        try:
            if not self.stream:
                await self._unary(prompt, params, result, clock)
                return
            if isinstance(prompt, str):
                stream = await self.client.generate(prompt, params, stream=True)
            else:
                stream = await self.client.generate(
                    input_ids=prompt, sampling_params=params, stream=True
                )
            async for chunk in stream:
                clock.tokens(len(chunk.token_ids))
                result.reply_ids.extend(chunk.token_ids)
                result.reply_text += chunk.text
                result.worker = chunk.worker_id or result.worker
                result.prompt_tokens = chunk.prompt_tokens
                result.cached_tokens = chunk.cached_tokens
                result.output_tokens = chunk.completion_tokens
        except grpc.aio.AioRpcError as e:
            result.error, result.detail = e.code().name, (e.details() or "")[:500]
        except Exception as e:  # the SDK's typed errors (radixmesh.errors)
            result.error = getattr(e, "grpc_status", None) or type(e).__name__
            result.detail = str(e)[:500]
        finally:
            clock.done()

    async def _unary(
        self, prompt: Prompt, params: dict[str, Any], result: RequestResult, clock: _Clock
    ) -> None:
        if isinstance(prompt, str):
            done = await self.client.generate(prompt, params)
        else:
            done = await self.client.generate(input_ids=prompt, sampling_params=params)
        clock.tokens(len(done.token_ids))
        result.reply_ids.extend(done.token_ids)
        result.reply_text = done.text
        result.worker = done.worker_id or result.worker
        result.prompt_tokens = done.prompt_tokens
        result.cached_tokens = done.cached_tokens
        result.output_tokens = done.completion_tokens

    async def close(self) -> None:
        await self.client.close()


class Spread:
    """Requests spread over several backends in turn (request i to backend i mod N)."""

    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends
        self.name = backends[0].name + "-direct"
        self.gives_ids = backends[0].gives_ids
        self._next = 0

    async def send(self, prompt: Prompt, max_tokens: int, result: RequestResult) -> None:
        backend = self.backends[self._next % len(self.backends)]
        self._next += 1
        await backend.send(prompt, max_tokens, result)

    async def close(self) -> None:
        for b in self.backends:
            await b.close()


def make_backend(
    name: str,
    *,
    http_url: str,
    grpc_target: str,
    model: str,
    api_key: str | None = None,
    workers: list[str] | None = None,
    connections: int = 1,
) -> Backend:
    """The named backend; the `-direct` ones over `workers` (their addresses). gRPC ones
    open `connections` connections (router replicas sharing a port each take some)."""
    if name in ("openai-completions", "openai-chat"):
        return OpenAIBackend(http_url, model, chat=name == "openai-chat", api_key=api_key)
    if name in ("grpc", "grpc-unary"):
        return GrpcBackend(
            grpc_target, api_key=api_key, stream=name == "grpc", connections=connections
        )
    if name in ("grpc-direct", "grpc-unary-direct"):
        if not workers:
            raise ValueError(f"backend: {name} needs the workers' addresses (--launch)")
        stream = name == "grpc-direct"
        return Spread([GrpcBackend(w, api_key=api_key, stream=stream) for w in workers])
    raise ValueError(f"backend: unknown {name!r}; choose from {', '.join(BACKENDS)}")


# The -direct backends skip the router: the same gRPC load spread over every worker.
BACKENDS = (
    "openai-completions",
    "openai-chat",
    "grpc",
    "grpc-unary",
    "grpc-direct",
    "grpc-unary-direct",
)
