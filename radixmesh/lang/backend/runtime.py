"""The cluster backend: `RuntimeEndpoint` over the gRPC client SDK, `Runtime` launching one.

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

`Runtime` belongs to the launcher's side of DESIGN.md's import rule (only `cluster/`
composes processes), but SGLang programs spell it `sgl.Runtime(...)`, so it is exported
here; the launching itself is `radixmesh.cluster.runtime`, imported lazily when a
Runtime is created (the one place the language reaches into `cluster/`).
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.lang.backend.base import Backend, Context, GenResult
from radixmesh.lang.backend.scoring import (
    PREFILL_PARAMS,
    check_finished,
    score_choices,
    score_params,
)
from radixmesh.lang.chat_template import ChatTemplate
from radixmesh.lang.choices import TokenLogprob

if TYPE_CHECKING:
    from radixmesh.client import Chunk, Completion
    from radixmesh.cluster.launch import LocalCluster


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
    """`RuntimeEndpoint("host:port", api_key=None)`: a router's (or a worker's) gRPC address."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
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
        self.target = _target(base_url)
        self.client = Client(
            self.target,
            api_key=api_key,
            tls=tls,
            root_certificates=root_certificates,
            timeout=timeout,
            max_retries=max_retries,
        )
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
        self.chat_template = ChatTemplate.from_tokenizer(self.tokenizer)
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="radixmesh-endpoint")
        self.usage = Usage()

    def get_model_name(self) -> str:
        return self.model_info.model

    # ---- generate -------------------------------------------------------------------

    def generate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        n = params.get("n", 1)
        if n == 1:
            return self._complete(ctx.text, params)
        one = {**params, "n": 1}
        outs = list(self._pool.map(lambda _: self._complete(ctx.text, one), range(n)))
        return [text for text, _ in outs], {"choices": [meta for _, meta in outs]}

    def _complete(self, text: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        out = self.client.generate(text, params)
        return out.text, check_finished(self._meta(out, params))

    def generate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        if params.get("n", 1) != 1:
            raise InvalidArgument("n", "streaming generates one completion (n=1)")
        for chunk in self.client.generate(ctx.text, params, stream=True):
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

    def cache_prefix(self, text: str) -> None:
        if text:
            out = self.client.generate(text, dict(PREFILL_PARAMS))
            check_finished(self._meta(out, {}))  # counted in `usage` too

    def flush_cache(self) -> bool:
        return self.client.flush_cache()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


class Runtime:
    """`Runtime(model="smollm2", workers=1, **engine_options)`: a local cluster (a router
    and `workers` worker processes, each `radixmesh worker` with these engine options) and
    a `RuntimeEndpoint` to it, `.endpoint`. Stop it with `shutdown()` or a `with` block;
    a Runtime still running when the interpreter exits is shut down then."""

    def __init__(
        self,
        model: str | None = None,
        workers: int = 1,
        *,
        model_path: str | None = None,  # SGLang's name for `model`
        policy: str = "cache_aware",
        host: str = "127.0.0.1",
        port: int | None = None,
        ready_timeout: float = 300.0,
        **engine_options: Any,
    ) -> None:
        from radixmesh.cluster.runtime import start_local_cluster

        if model is not None and model_path is not None:
            raise InvalidArgument("model_path", "give model or model_path, not both")
        self._lock = threading.Lock()
        self.endpoint: RuntimeEndpoint | None = None
        self.cluster: LocalCluster | None = start_local_cluster(
            model or model_path or "smollm2",
            workers,
            policy=policy,
            host=host,
            port=port,
            ready_timeout=ready_timeout,
            engine_options=engine_options,
        )
        atexit.register(self.shutdown)
        try:
            self.endpoint = RuntimeEndpoint(self.cluster.address)
        except BaseException:
            self.shutdown()
            raise

    @property
    def url(self) -> str:
        """The router's gRPC address, for `RuntimeEndpoint` or the SDK's `Client`."""
        if self.cluster is None:
            raise Unavailable("this Runtime has been shut down")
        return self.cluster.address

    @property
    def worker_addresses(self) -> list[str]:
        return [] if self.cluster is None else self.cluster.worker_addresses

    def shutdown(self) -> None:
        """Close the endpoint and stop every process (idempotent)."""
        with self._lock:
            endpoint, self.endpoint = self.endpoint, None
            cluster, self.cluster = self.cluster, None
        if endpoint is not None:
            endpoint.shutdown()
        if cluster is not None:
            cluster.stop()
        atexit.unregister(self.shutdown)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _target(base_url: str) -> str:
    """ "host:port" from what users pass (a bare address or grpc://host:port)."""
    if not isinstance(base_url, str) or not base_url:
        raise InvalidArgument("base_url", f"expected 'host:port', got {base_url!r}")
    if base_url.startswith(("http://", "https://")):
        raise InvalidArgument(
            "base_url",
            f"RuntimeEndpoint speaks gRPC: give the router's gRPC address 'host:port', not "
            f"{base_url!r} (the router's HTTP port serves the OpenAI-compatible API: use "
            "sgl.OpenAI(model, base_url=...) for it)",
        )
    target = base_url.removeprefix("grpc://").rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgument("base_url", f"expected 'host:port', got {base_url!r}")
    return target


def _entries(logprobs: list[Any]) -> list[tuple[float | None, int, None]]:
    return [(e.logprob, e.token_id, None) for e in logprobs]
