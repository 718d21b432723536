"""The cluster backend: `RuntimeEndpoint` over the gRPC client SDK (sync and asyncio).

`RuntimeEndpoint("host:port")` talks to a router (or to one worker directly; the SDK
asks the target which it is). It sends the engine backend's requests: the same
sampling-parameter dicts, and `select` scored from prompt logprobs exactly as in-process
(`scoring.py`); only the transport differs. Scoring requests and the copies of an
n > 1 `gen` go out concurrently (the gRPC API generates one completion per request),
and the router places them on the worker that caches their shared prefix.
Each gen's meta_info has the engine's keys plus `worker_id`, the worker that served it;
`endpoint.usage` counts prompt / cached / completion tokens per worker over every request.

The client needs the model's tokenizer (for the chat template and to score choices): it
builds the one the cluster names in its model info, as the router does (the tokenizer
files must be readable here; no worker code is imported).

Forks and batches tag their requests with a program id (`program_hint`): the router keeps
a program's requests with its shared prefix (radixmesh/router/programs.py).
`Runtime`, which launches a cluster, is local_runtime.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixmesh.client.types import ProgramHint
from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.lang.backend.base import Backend, Context, GenResult
from radixmesh.lang.backend.scoring import (
    PREFILL_PARAMS,
    ascore_choices,
    check_finished,
    score_choices,
    score_params,
)
from radixmesh.lang.chat_template import ChatTemplate, named_template
from radixmesh.lang.choices import TokenLogprob

if TYPE_CHECKING:
    from radixmesh.client import AsyncClient, Chunk, Completion


@dataclass
class WorkerUsage:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Usage:
    """Token counts of every request an endpoint finished (prefills and scoring included),
    per serving worker and in total (`usage.total`); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = WorkerUsage()
        self.by_worker: dict[str, WorkerUsage] = {}

    def add(self, meta: dict[str, Any]) -> None:
        with self._lock:
            for u in (self.total, self.by_worker.setdefault(meta["worker_id"], WorkerUsage())):
                u.requests += 1
                u.prompt_tokens += meta["prompt_tokens"]
                u.cached_tokens += meta["cached_tokens"]
                u.completion_tokens += meta["completion_tokens"]

    def snapshot(self) -> dict[str, WorkerUsage]:
        """A copy: {"total": ..., worker id: ...}."""
        with self._lock:
            items = {"total": self.total, **self.by_worker}
            return {k: dataclasses.replace(v) for k, v in items.items()}


class RuntimeEndpoint(Backend):
    """`RuntimeEndpoint(base_url, api_key=None, verify=None, chat_template_name=None)`:
    a router (or a worker). `base_url` is its gRPC address "host:port", or the router's
    HTTP URL (SGLang's form), from which the client reads the gRPC port and speaks gRPC.
    `verify`: a CA file (PEM) for TLS. `chat_template_name`: one of SGLang's template
    names instead of the model's own template."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify: str | bool | None = None,
        chat_template_name: str | None = None,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        timeout: float | None = None,
        max_retries: int = 3,
        max_concurrency: int = 64,
    ) -> None:
        from radixmesh.client import Client
        from radixmesh.tokenizer import tokenizer_for

        if max_concurrency < 1:
            raise InvalidArgument("max_concurrency", f"must be >= 1, got {max_concurrency}")
        if isinstance(verify, str):
            root_certificates = _read_pem(verify)
        self.base_url = base_url
        self.api_key = api_key
        self.target, https = resolve_target(base_url, api_key, verify)
        self._options: dict[str, Any] = {
            "api_key": api_key,
            "tls": tls or https,
            "root_certificates": root_certificates,
            "timeout": timeout,
            "max_retries": max_retries,
        }
        self.client = Client(self.target, **self._options)
        # One asyncio client per event loop (a grpc.aio channel belongs to its loop).
        self._async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient]
        self._async_clients = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        try:
            self.model_info = self.client.model_info()
        except Unavailable as e:
            self.client.close()
            raise Unavailable(f"no radixmesh router or worker answers at {self.target}: {e}") from e
        info = self.model_info
        self.tokenizer = tokenizer_for(
            info.tokenizer,
            vocab_size=info.vocab_size,
            eos_token_ids=info.eos_token_ids,
            bos_token_id=info.bos_token_id,
            chat_template=info.chat_template or None,
        )
        if chat_template_name is not None:
            self.chat_template = named_template(chat_template_name)
        else:
            self.chat_template = ChatTemplate.from_tokenizer(self.tokenizer)
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="radixmesh-endpoint")
        self.usage = Usage()
        # Tag forks' and batches' requests with their program (program-aware routing).
        self.program_hints = True

    # ---- generate -------------------------------------------------------------------

    def generate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        n = params.get("n", 1)
        if n == 1:
            return self._complete(ctx, params)
        one = {**params, "n": 1}
        outs = list(self._pool.map(lambda _: self._complete(ctx, one), range(n)))
        return [text for text, _ in outs], {"choices": [meta for _, meta in outs]}

    def _complete(self, ctx: Context, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        out = self.client.generate(ctx.text, params, program=self._program(ctx.program))
        return out.text, check_finished(self._meta(out, params))

    def _program(self, program: ProgramHint | None) -> ProgramHint | None:
        return program if self.program_hints else None

    def program_hint(self, prefix: str) -> ProgramHint | None:
        if not self.program_hints or not prefix:
            return None
        return ProgramHint(uuid.uuid4().hex, len(self.tokenizer.encode(prefix)))

    # ---- asyncio: the same calls over the async gRPC client, no thread per request ----

    def aclient(self) -> AsyncClient:
        """The asyncio client of the running event loop (made on first use)."""
        from radixmesh.client import AsyncClient

        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._async_clients.get(loop)
            if client is None:
                client = AsyncClient(self.target, **self._options)
                self._async_clients[loop] = client
        return client

    async def agenerate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        n = params.get("n", 1)
        if n == 1:
            return await self._acomplete(ctx, params)
        one = {**params, "n": 1}
        outs = await asyncio.gather(*(self._acomplete(ctx, one) for _ in range(n)))
        return [text for text, _ in outs], {"choices": [meta for _, meta in outs]}

    async def _acomplete(self, ctx: Context, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        program = self._program(ctx.program)
        out = await self.aclient().generate(ctx.text, params, program=program)
        return out.text, check_finished(self._meta(out, params))

    async def agenerate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        if params.get("n", 1) != 1:
            raise InvalidArgument("n", "streaming generates one completion (n=1)")
        program = self._program(ctx.program)
        stream = await self.aclient().generate(ctx.text, params, stream=True, program=program)
        async for chunk in stream:
            yield chunk.text, check_finished(self._meta(chunk, params))

    async def ascore(
        self, ctx: Context, choices: list[str], unconditional: bool
    ) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
        program = self._program(ctx.program)

        async def logprobs(
            ids: list[list[int]], starts: list[int]
        ) -> list[list[tuple[float | None, int]]]:
            return await self._alogprobs(ids, starts, program)

        return await ascore_choices(self.tokenizer, ctx.text, choices, unconditional, logprobs)

    async def _alogprobs(
        self, ids: list[list[int]], starts: list[int], program: ProgramHint | None = None
    ) -> list[list[tuple[float | None, int]]]:
        async def one(seq: list[int], start: int) -> list[tuple[float | None, int]]:
            out = await self.aclient().generate(
                input_ids=seq, sampling_params=score_params(start), program=program
            )
            check_finished(self._meta(out, {}))
            return [(e.logprob, e.token_id) for e in out.input_logprobs]

        return list(await asyncio.gather(*(one(s, st) for s, st in zip(ids, starts, strict=True))))

    async def acache_prefix(self, text: str, program: ProgramHint | None = None) -> None:
        if text:
            out = await self.aclient().generate(
                text, dict(PREFILL_PARAMS), program=self._program(program)
            )
            check_finished(self._meta(out, {}))

    def generate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        if params.get("n", 1) != 1:
            raise InvalidArgument("n", "streaming generates one completion (n=1)")
        program = self._program(ctx.program)
        for chunk in self.client.generate(ctx.text, params, stream=True, program=program):
            yield chunk.text, check_finished(self._meta(chunk, params))

    def _meta(self, c: Chunk, params: dict[str, Any]) -> dict[str, Any]:
        """The engine's meta_info from an SDK chunk, and the worker that served it."""
        reason: dict[str, Any] | None = None
        if c.finish_reason is not None:
            reason = {"type": c.finish_reason}
            if c.matched_stop is not None:
                reason["matched"] = c.matched_stop
            if c.finish_reason == "length":
                reason["length"] = c.completion_tokens
            if c.finish_message:
                reason["message"] = c.finish_message
        meta: dict[str, Any] = {
            "id": c.request_id,
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens,
            "cached_tokens": c.cached_tokens,
            "finish_reason": reason,
            "worker_id": c.worker_id or self.target,
        }
        if c.spec_verify_steps:  # the engine's names (SGLang's), where anything was drafted
            meta["spec_verify_ct"] = c.spec_verify_steps
            meta["spec_draft_tokens"] = c.spec_drafted_tokens
            meta["spec_accepted_tokens"] = c.spec_accepted_tokens
        if reason is not None:
            self.usage.add(meta)
        if params.get("return_logprob"):
            meta["output_token_logprobs"] = _entries(c.logprobs)
            if params.get("top_logprobs_num"):
                meta["output_top_logprobs"] = [_entries(t) for t in c.top_logprobs]
            if params.get("logprob_start_len") is not None and hasattr(c, "input_logprobs"):
                meta["input_token_logprobs"] = _entries(c.input_logprobs)
        return meta

    # ---- select, cache --------------------------------------------------------------

    def score(
        self, ctx: Context, choices: list[str], unconditional: bool
    ) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
        return score_choices(self.tokenizer, ctx.text, choices, unconditional, self._logprobs)

    def _logprobs(
        self, ids: list[list[int]], starts: list[int]
    ) -> list[list[tuple[float | None, int]]]:
        """The scoring requests, concurrently (one gRPC request each)."""

        def one(seq: list[int], start: int) -> list[tuple[float | None, int]]:
            out: Completion = self.client.generate(
                input_ids=seq, sampling_params=score_params(start)
            )
            check_finished(self._meta(out, {}))
            return [(e.logprob, e.token_id) for e in out.input_logprobs]

        return list(self._pool.map(one, ids, starts))

    def cache_prefix(self, text: str, program: ProgramHint | None = None) -> None:
        if text:
            out = self.client.generate(text, dict(PREFILL_PARAMS), program=self._program(program))
            check_finished(self._meta(out, {}))  # counted in `usage` too

    def flush_cache(self) -> bool:
        return self.client.flush_cache()

    def get_server_info(self) -> dict[str, Any]:
        info = dataclasses.asdict(self.model_info)
        return {"model_path": info.pop("model"), **info, "target": self.target}

    def get_model_name(self) -> str:
        return self.model_info.model

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        with self._lock:
            clients, self._async_clients = dict(self._async_clients), weakref.WeakKeyDictionary()
        for loop, client in clients.items():
            if not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    asyncio.run_coroutine_threadsafe(client.close(), loop)


def resolve_target(
    base_url: str, api_key: str | None = None, verify: str | bool | None = None
) -> tuple[str, bool]:
    """("host:port" of the gRPC API, whether it is TLS) from what users pass: a gRPC
    address ("host:port", "grpc://host:port") or a router's HTTP URL, whose
    `/get_server_info` names the router's gRPC port."""
    if not isinstance(base_url, str) or not base_url:
        raise InvalidArgument("base_url", f"expected 'host:port' or a URL, got {base_url!r}")
    if base_url.startswith(("http://", "https://")):
        return _grpc_of_http(base_url.rstrip("/"), api_key, verify)
    target = base_url.removeprefix("grpc://").rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgument("base_url", f"expected 'host:port', got {base_url!r}")
    return target, False


def _grpc_of_http(url: str, api_key: str | None, verify: str | bool | None) -> tuple[str, bool]:
    import ssl
    import urllib.error
    import urllib.parse
    import urllib.request

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
        if verify is False:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(url + "/get_server_info", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as resp:
            info = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise Unavailable(f"no radixmesh router answers at {url}: {e}") from e
    port = info.get("grpc_port") if isinstance(info, dict) else None
    if not isinstance(port, int):
        raise InvalidArgument("base_url", f"{url} is not a radixmesh router (no grpc_port)")
    host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
    return f"{host}:{port}", url.startswith("https://")


def _read_pem(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidArgument("verify", f"cannot read the CA file {path!r}: {e}") from None


def _entries(logprobs: list[Any]) -> list[tuple[float | None, int, None]]:
    return [(e.logprob, e.token_id, None) for e in logprobs]
