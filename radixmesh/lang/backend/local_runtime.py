"""`Runtime`: a local cluster launched from Python, and a `RuntimeEndpoint` to it.

`Runtime` belongs to the launcher's side of DESIGN.md's import rule (only `cluster/`
composes processes), but SGLang programs spell it `sgl.Runtime(...)`, so it is exported
from the language; the launching itself is `radixmesh.cluster.runtime`, imported lazily
when a Runtime is created (the one place the language reaches into `cluster/`). Its
SGLang methods (`generate`, `async_generate`, ...) speak the router's native HTTP API.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from radixmesh.errors import InvalidArgument, RadixMeshError, Unavailable
from radixmesh.lang.backend.runtime import RuntimeEndpoint

if TYPE_CHECKING:
    from radixmesh.cluster.launch import LocalCluster

# SGLang's server arguments that mean the same as one of ours, under our name.
_SERVER_ARGS = {"mem_fraction_static": "mem_fraction", "random_seed": "seed"}


class Runtime:
    """`Runtime(model_path="smollm2", dp_size=1, **server_args)`: a local cluster (a
    router and `dp_size` worker processes, each `radixmesh worker` with these engine
    options) and a `RuntimeEndpoint` to it, `.endpoint`. `url` is the router's HTTP API
    (SGLang's native one beside OpenAI's), `address` its gRPC API. Stop it with
    `shutdown()` or a `with` block; one still running at interpreter exit is stopped then.
    Also `model=` / `workers=` (our names), `policy=`, `host=`, `port=` (the router's
    gRPC port), `launch_timeout=`."""

    def __init__(
        self,
        log_level: str = "error",
        launch_timeout: float = 300.0,
        *,
        model: str | None = None,
        model_path: str | None = None,
        workers: int | None = None,
        dp_size: int | None = None,
        policy: str = "cache_aware",
        host: str = "127.0.0.1",
        port: int | None = None,
        **server_args: Any,
    ) -> None:
        from radixmesh.cluster.launch import free_port
        from radixmesh.cluster.runtime import start_local_cluster

        if model is not None and model_path is not None:
            raise InvalidArgument("model_path", "give model or model_path, not both")
        if workers is not None and dp_size is not None:
            raise InvalidArgument("dp_size", "give workers or dp_size, not both")
        if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise InvalidArgument("log_level", f"not a log level: {log_level!r}")
        self.log_level = log_level
        engine_options = {_SERVER_ARGS.get(k, k): v for k, v in server_args.items()}
        self._lock = threading.Lock()
        self.endpoint: RuntimeEndpoint | None = None
        self.http_port = free_port(host)
        self.cluster: LocalCluster | None = start_local_cluster(
            model or model_path or "smollm2",
            next((n for n in (workers, dp_size) if n is not None), 1),
            policy=policy,
            host=host,
            port=port,
            ready_timeout=launch_timeout,
            engine_options=engine_options,
            http_port=self.http_port,
        )
        atexit.register(self.shutdown)
        self.url = f"http://{host}:{self.http_port}"
        self.generate_url = self.url + "/generate"
        try:
            self.endpoint = RuntimeEndpoint(self.cluster.address)
        except BaseException:
            self.shutdown()
            raise

    @property
    def address(self) -> str:
        """The router's gRPC address, for `RuntimeEndpoint` or the SDK's `Client`."""
        if self.cluster is None:
            raise Unavailable("this Runtime has been shut down")
        return self.cluster.address

    @property
    def worker_addresses(self) -> list[str]:
        return [] if self.cluster is None else self.cluster.worker_addresses

    def _endpoint(self) -> RuntimeEndpoint:
        if self.endpoint is None:
            raise Unavailable("this Runtime has been shut down")
        return self.endpoint

    def cache_prefix(self, prefix: str) -> None:
        self._endpoint().cache_prefix(prefix)

    def get_tokenizer(self) -> Any:
        return self._endpoint().tokenizer

    def start_profile(self) -> None:
        raise InvalidArgument("start_profile", "profiling runs through bench/step_anatomy.py")

    stop_profile = start_profile

    def generate(
        self,
        prompt: str | list[str],
        sampling_params: dict[str, Any] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        lora_path: Any = None,
        session_id: Any = None,
    ) -> str:
        """POST /generate on the router (SGLang's native API); the reply as JSON text."""
        if lora_path is not None or session_id is not None:
            field = "lora_path" if lora_path is not None else "session_id"
            raise InvalidArgument(field, "LoRA adapters and sessions are not served")
        body = {
            "text": prompt,
            "sampling_params": sampling_params,
            "return_logprob": return_logprob,
            "logprob_start_len": logprob_start_len,
            "top_logprobs_num": top_logprobs_num,
        }
        return _post_json(self.generate_url, {k: v for k, v in body.items() if v is not None})

    def encode(self, prompt: str | list[str]) -> str:
        """The prompt's token ids, as JSON text ({"input_ids": ...})."""
        tok = self._endpoint().tokenizer
        if isinstance(prompt, str):
            return json.dumps({"input_ids": tok.encode(prompt)})
        return json.dumps([{"input_ids": tok.encode(p)} for p in prompt])

    async def async_generate(
        self,
        prompt: str,
        sampling_params: dict[str, Any] | None = None,
        session_id: Any = None,
    ) -> AsyncIterator[str]:
        """Stream a completion's text deltas from the router's /generate."""
        if session_id is not None:
            raise InvalidArgument("session_id", "sessions are not served")
        import aiohttp

        body = {"text": prompt, "sampling_params": sampling_params or {}, "stream": True}
        seen = 0
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.generate_url, json=body) as resp,
        ):
            async for line in resp.content:
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                data = json.loads(line[5:])
                if "text" not in data:
                    raise RadixMeshError(str(data.get("error", data)))
                yield data["text"][seen:]
                seen = len(data["text"])

    add_request = async_generate

    async def get_server_info(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._endpoint().get_server_info)

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


def _post_json(url: str, body: dict[str, Any]) -> str:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as resp:
            return str(resp.read().decode())
    except urllib.error.HTTPError as e:
        return str(e.read().decode())
