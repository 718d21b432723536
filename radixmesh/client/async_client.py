"""`AsyncClient`: the asyncio twin of `Client` (grpc.aio), same arguments and results,
spreading calls over several routers and `connections` the same way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import grpc
from grpc_health.v1 import health_pb2

from radixmesh.v1 import common_pb2, router_pb2, worker_pb2

from . import convert
from .channels import Channels, StubsInTurn
from .client import Params, Service
from .options import (
    CONNECT_RETRY_WINDOW_S,
    RESOLVE_TIMEOUT_S,
    ClientOptions,
    Deadline,
    Retries,
)
from .resume import ResumableStream
from .types import Chunk, Completion, Embedding, Load, ModelInfo, ProgramHint, Selection

T = TypeVar("T")


class AsyncClient(StubsInTurn):
    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        tls: bool = False,
        root_certificates: bytes | None = None,
        timeout: float | None = None,
        max_retries: int = 3,
        service: Service = "auto",
        connections: int = 1,
        max_retry_after: float = 30.0,
        retry_overloaded: bool = False,
        connect_retry_window: float = CONNECT_RETRY_WINDOW_S,
    ) -> None:
        """`target`, `connections` and the retry options as `Client`'s: several routers
        spread calls round robin over those READY; `connections` per address, >= 1."""
        self.target = target
        self.options = ClientOptions(
            api_key,
            tls,
            root_certificates,
            timeout,
            max_retries,
            connections=connections,
            max_retry_after=max_retry_after,
            retry_overloaded=retry_overloaded,
            connect_retry_window=connect_retry_window,
        )
        self._channels = Channels(target, self.options, aio=True)
        self._service: Service = service

    # ---- generation -------------------------------------------------------------------

    @overload
    async def generate(
        self,
        prompt: str | None = None,
        sampling_params: Params = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        input_ids: Sequence[int] | None = None,
        stream: Literal[False] = False,
        request_id: str = "",
        timeout: float | None = None,
        program: ProgramHint | None = None,
    ) -> Completion: ...

    @overload
    async def generate(
        self,
        prompt: str | None = None,
        sampling_params: Params = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        input_ids: Sequence[int] | None = None,
        stream: Literal[True],
        request_id: str = "",
        timeout: float | None = None,
        program: ProgramHint | None = None,
    ) -> AsyncGenerator[Chunk, None]: ...

    async def generate(
        self,
        prompt: str | None = None,
        sampling_params: Params = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        input_ids: Sequence[int] | None = None,
        stream: bool = False,
        request_id: str = "",
        timeout: float | None = None,
        program: ProgramHint | None = None,
    ) -> Completion | AsyncGenerator[Chunk, None]:
        """Like `Client.generate`; stream=True -> an async iterator of Chunks."""
        inp = convert.make_input(prompt, messages, input_ids)
        params = convert.make_params(sampling_params)
        deadline = Deadline(timeout if timeout is not None else self.options.timeout)
        if stream:
            return self._stream(inp, params, request_id, deadline, program)

        async def once(t: float | None) -> Any:
            last = None
            async for resp in await self._generate_call(inp, params, request_id, False, t, program):
                last = resp
            return last

        resp = await self._retry(once, deadline)
        return convert.completion_from_proto(resp.chunk, convert.served_by(resp))

    async def _generate_call(
        self,
        inp: common_pb2.Input,
        params: common_pb2.SamplingParams,
        rid: str,
        stream: bool,
        timeout: float | None,
        program: ProgramHint | None = None,
    ) -> Any:
        md = self.options.metadata()
        if await self._resolve() == "router":
            req: Any = router_pb2.RouterGenerateRequest(
                input=inp, sampling_params=params, request_id=rid, stream=stream
            )
            if program is not None:
                req.program_id = program.program_id
                req.shared_prefix_tokens = program.shared_prefix_tokens
            return self._router.Generate(req, timeout=timeout, metadata=md)
        req = worker_pb2.GenerateRequest(
            input=inp, sampling_params=params, request_id=rid, stream=stream
        )
        return self._worker.Generate(req, timeout=timeout, metadata=md)

    def _stream(
        self,
        inp: common_pb2.Input,
        params: common_pb2.SamplingParams,
        rid: str,
        deadline: Deadline,
        program: ProgramHint | None = None,
    ) -> AsyncGenerator[Chunk, None]:
        async def start(timeout: float | None) -> Any:
            return await self._generate_call(inp, params, rid, True, timeout, program)

        return self._follow(ResumableStream(), deadline, start)

    def resume(
        self, stream_id: str, offset: int = 0, *, timeout: float | None = None
    ) -> AsyncGenerator[Chunk, None]:
        """Continue a stream (a Chunk's `stream_id`) after its first `offset` completion
        tokens, through any router (Client.resume says more)."""
        deadline = Deadline(timeout if timeout is not None else self.options.timeout)
        return self._follow(ResumableStream(resume_at=(stream_id, offset)), deadline, None)

    async def _follow(
        self,
        stream: ResumableStream,
        deadline: Deadline,
        start: Callable[[float | None], Awaitable[Any]] | None,
    ) -> AsyncGenerator[Chunk, None]:
        """A stream's chunks: from `start`'s call (None: `stream` is a resume from the
        outset), then from Resume calls each time it breaks where it may resume."""
        retries = Retries(self.options)
        while True:
            if stream.resume_at is None:
                assert start is not None
                call = await start(deadline.remaining())
            else:
                call = self._resume_call(*stream.resume_at, deadline.remaining())
            try:
                async for resp in call:
                    retries.reset()
                    yield stream.chunk(resp)
                return
            except grpc.RpcError as e:
                if stream.finished:  # it broke after its last chunk: nothing is missing
                    return
                if not stream.may_retry(e) or not await self._wait_retry(e, retries, deadline):
                    raise stream.error(e) from None
            finally:
                call.cancel()

    def _resume_call(self, stream_id: str, offset: int, timeout: float | None) -> Any:
        req = router_pb2.ResumeRequest(stream_id=stream_id, offset=offset)
        return self._router.Resume(req, timeout=timeout, metadata=self.options.metadata())

    async def select(
        self,
        prompt: str | None = None,
        choices: Sequence[str] = (),
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        input_ids: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> Selection:
        inp = convert.make_input(prompt, messages, input_ids)
        req = convert.score_request(inp, choices)
        deadline = Deadline(timeout if timeout is not None else self.options.timeout)
        md = self.options.metadata()
        if await self._resolve() == "router":
            sreq = router_pb2.SelectRequest(input=inp, choices=list(choices))
            resp = await self._retry(
                lambda t: self._router.Select(sreq, timeout=t, metadata=md), deadline
            )
            return convert.selection_from_proto(resp)
        scores = await self._retry(
            lambda t: self._worker.Score(req, timeout=t, metadata=md), deadline
        )
        return convert.selection_from_scores(list(choices), scores)

    async def embed(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        input_ids: Sequence[int] | None = None,
        pooling: str = "mean",
        request_id: str = "",
        timeout: float | None = None,
    ) -> Embedding:
        """Like `Client.embed`."""
        inp = convert.make_input(prompt, messages, input_ids)
        kind = convert.pooling(pooling)
        deadline = Deadline(timeout if timeout is not None else self.options.timeout)
        md = self.options.metadata()
        if await self._resolve() == "router":
            rreq = router_pb2.RouterEmbedRequest(input=inp, pooling=kind, request_id=request_id)
            resp = await self._retry(
                lambda t: self._router.Embed(rreq, timeout=t, metadata=md), deadline
            )
            return convert.embedding_from_proto(resp.embedding, resp.worker_id)
        wreq = worker_pb2.EmbedRequest(input=inp, pooling=kind, request_id=request_id)
        wresp = await self._retry(
            lambda t: self._worker.Embed(wreq, timeout=t, metadata=md), deadline
        )
        return convert.embedding_from_proto(wresp.embedding)

    # ---- control ----------------------------------------------------------------------

    async def abort(self, request_id: str) -> bool:
        md = self.options.metadata()
        deadline = Deadline(self.options.timeout)
        if await self._resolve() == "router":
            rreq = router_pb2.RouterAbortRequest(request_id=request_id)
            resp: Any = await self._retry(
                lambda t: self._router.Abort(rreq, timeout=t, metadata=md), deadline
            )
        else:
            wreq = worker_pb2.AbortRequest(request_id=request_id)
            resp = await self._retry(
                lambda t: self._worker.Abort(wreq, timeout=t, metadata=md), deadline
            )
        return bool(resp.found)

    async def health(self, service: str = "", timeout: float | None = 5.0) -> bool:
        try:
            resp = await self._health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as e:
            if convert.server_went_away(e) or e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return False
            raise convert.error_from_rpc(e) from None
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    async def model_info(self) -> ModelInfo:
        md = self.options.metadata()
        deadline = Deadline(self.options.timeout)
        if await self._resolve() == "router":
            rreq = router_pb2.RouterGetModelInfoRequest()
            resp: Any = await self._retry(
                lambda t: self._router.GetModelInfo(rreq, timeout=t, metadata=md), deadline
            )
        else:
            wreq = worker_pb2.GetModelInfoRequest()
            resp = await self._retry(
                lambda t: self._worker.GetModelInfo(wreq, timeout=t, metadata=md), deadline
            )
        return convert.model_info_from_proto(resp.info)

    async def load(self) -> Load:
        md = self.options.metadata()
        req = worker_pb2.GetLoadRequest()
        resp = await self._retry(
            lambda t: self._worker.GetLoad(req, timeout=t, metadata=md),
            Deadline(self.options.timeout),
        )
        return convert.load_from_proto(resp)

    async def flush_cache(self) -> bool:
        md = self.options.metadata()
        deadline = Deadline(self.options.timeout)
        if await self._resolve() == "router":
            rreq = router_pb2.RouterFlushCacheRequest()
            resp: Any = await self._retry(
                lambda t: self._router.FlushCache(rreq, timeout=t, metadata=md), deadline
            )
            return bool(resp.flushed == resp.total)
        wreq = worker_pb2.FlushCacheRequest()
        resp = await self._retry(
            lambda t: self._worker.FlushCache(wreq, timeout=t, metadata=md), deadline
        )
        return bool(resp.flushed)

    async def close(self) -> None:
        for channel in self._channels.channels():
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- plumbing ---------------------------------------------------------------------

    async def _resolve(self) -> Service:
        """As `Client._resolve`: asked once, again under the retry policy when the
        server went away or is still starting."""
        if self._service == "auto":
            req = router_pb2.RouterGetModelInfoRequest()
            md = self.options.metadata()
            deadline, retries = Deadline(RESOLVE_TIMEOUT_S), Retries(self.options)
            while self._service == "auto":
                try:
                    await self._router.GetModelInfo(req, timeout=deadline.remaining(), metadata=md)
                    self._service = "router"
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                        self._service = "worker"
                    elif not await self._wait_retry(e, retries, deadline):
                        raise convert.error_from_rpc(e) from None
        return self._service

    async def _retry(self, fn: Callable[[float | None], Awaitable[T]], deadline: Deadline) -> T:
        retries = Retries(self.options)
        while True:
            try:
                return await fn(deadline.remaining())
            except grpc.RpcError as e:
                if not await self._wait_retry(e, retries, deadline):
                    raise convert.error_from_rpc(e) from None

    async def _wait_retry(self, e: grpc.RpcError, retries: Retries, deadline: Deadline) -> bool:
        delay = retries.wait(e)  # honours the server's retry-after
        if delay is None or not deadline.allows(delay):
            return False
        await asyncio.sleep(delay)
        return True
