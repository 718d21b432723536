"""`Client`: the blocking gRPC SDK, for a router or a single worker.

`service="auto"` asks the target once whether it serves `radixmesh.v1.Router` and falls
back to `radixmesh.v1.Worker` (so the same client talks to `radixmesh worker` directly).
A target of several comma-separated routers (`host:port,host:port`) spreads calls over
them, round robin over those READY, skipping routers that are down (channels.Channels);
`connections=N` opens N connections to each address and rotates calls over them. A
request that failed before its first token is retried, on the next router or connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import grpc
from grpc_health.v1 import health_pb2

from radixmesh.sampling_params import SamplingParams
from radixmesh.v1 import common_pb2, router_pb2, worker_pb2

from . import convert
from .channels import Channels, StubsInTurn
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
Service = Literal["auto", "worker", "router"]
Params = Mapping[str, Any] | SamplingParams | None


class Client(StubsInTurn):
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
        """`target`: `host:port`, any gRPC target (`dns:///name:port`), or several routers
        as `host:port,host:port`: each call then goes to the next READY router (gRPC's
        round_robin), so routers that are down are skipped.

        `connections`: independent connections to open to each address of the target
        (default 1), calls rotating over them. Router replicas on one machine share a
        port (SO_REUSEPORT) and the kernel spreads connections, not calls, over them, so
        one client reaches several replicas only through several connections. It applies
        per address: a list of R routers with `connections=N` holds R*N connections,
        so a host of several replicas in a list is spread over as well. Below 1:
        InvalidArgument naming `connections`.

        Retries (`max_retries`, before the first token) wait a server's retry-after, up
        to `max_retry_after` seconds (a longer ask raises at once); `retry_overloaded`
        also retries a server's refusal for load. A call whose connection could not be
        made (a router restarting) is retried for `connect_retry_window` seconds instead,
        not counted against `max_retries` (options.py says how)."""
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
        self._channels = Channels(target, self.options)
        self._service: Service = service

    # ---- generation -------------------------------------------------------------------

    @overload
    def generate(
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
    def generate(
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
    ) -> Generator[Chunk, None, None]: ...

    def generate(
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
    ) -> Completion | Generator[Chunk, None, None]:
        """Complete text, chat messages or token ids. stream=True -> an iterator of Chunks
        (closing it early cancels the request on the server)."""
        inp = convert.make_input(prompt, messages, input_ids)
        params = convert.make_params(sampling_params)
        deadline = Deadline(timeout if timeout is not None else self.options.timeout)
        if stream:
            return self._stream(inp, params, request_id, deadline, program)
        resp = self._retry(
            lambda t: self._generate_call(inp, params, request_id, False, t, program), deadline
        )
        return convert.completion_from_proto(resp.chunk, convert.served_by(resp))

    def _generate_call(
        self,
        inp: common_pb2.Input,
        params: common_pb2.SamplingParams,
        rid: str,
        stream: bool,
        timeout: float | None,
        program: ProgramHint | None = None,
    ) -> Any:
        md = self.options.metadata()
        if self._resolve() == "router":
            req: Any = router_pb2.RouterGenerateRequest(
                input=inp, sampling_params=params, request_id=rid, stream=stream
            )
            if program is not None:
                req.program_id = program.program_id
                req.shared_prefix_tokens = program.shared_prefix_tokens
            call = self._router.Generate(req, timeout=timeout, metadata=md)
        else:
            req = worker_pb2.GenerateRequest(
                input=inp, sampling_params=params, request_id=rid, stream=stream
            )
            call = self._worker.Generate(req, timeout=timeout, metadata=md)
        if stream:
            return call
        last = None
        for resp in call:
            last = resp
        return last

    def _stream(
        self,
        inp: common_pb2.Input,
        params: common_pb2.SamplingParams,
        rid: str,
        deadline: Deadline,
        program: ProgramHint | None = None,
    ) -> Generator[Chunk, None, None]:
        def start(timeout: float | None) -> Any:
            return self._generate_call(inp, params, rid, True, timeout, program)

        return self._follow(ResumableStream(), deadline, start)

    def resume(
        self, stream_id: str, offset: int = 0, *, timeout: float | None = None
    ) -> Generator[Chunk, None, None]:
        """Continue a stream (a Chunk's `stream_id`) after its first `offset` completion
        tokens (the `offset` of the last chunk you have), through any router of the
        cluster; it resumes again on its own if this router goes away too. NotFound when
        no worker holds it any more (it finished, or its grace period passed)."""
        deadline = Deadline(timeout if timeout is not None else self.options.timeout)
        return self._follow(ResumableStream(resume_at=(stream_id, offset)), deadline, None)

    def _follow(
        self,
        stream: ResumableStream,
        deadline: Deadline,
        start: Callable[[float | None], Any] | None,
    ) -> Generator[Chunk, None, None]:
        """A stream's chunks: from `start`'s call (None: `stream` is a resume from the
        outset), then from Resume calls each time it breaks where it may resume."""
        retries = Retries(self.options)
        while True:
            if stream.resume_at is None:
                assert start is not None
                call = start(deadline.remaining())
            else:
                call = self._resume_call(*stream.resume_at, deadline.remaining())
            try:
                for resp in call:
                    retries.reset()
                    yield stream.chunk(resp)
                return
            except grpc.RpcError as e:
                if stream.finished:  # it broke after its last chunk: nothing is missing
                    return
                if not stream.may_retry(e) or not self._wait_retry(e, retries, deadline):
                    raise stream.error(e) from None
            finally:
                call.cancel()  # no-op when done; cancels the server request when closed early

    def _resume_call(self, stream_id: str, offset: int, timeout: float | None) -> Any:
        req = router_pb2.ResumeRequest(stream_id=stream_id, offset=offset)
        return self._router.Resume(req, timeout=timeout, metadata=self.options.metadata())

    def select(
        self,
        prompt: str | None = None,
        choices: Sequence[str] = (),
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        input_ids: Sequence[int] | None = None,
        timeout: float | None = None,
    ) -> Selection:
        """The most likely continuation (highest mean token logprob)."""
        inp = convert.make_input(prompt, messages, input_ids)
        req = convert.score_request(inp, choices)
        deadline = Deadline(timeout if timeout is not None else self.options.timeout)
        md = self.options.metadata()
        if self._resolve() == "router":
            sreq = router_pb2.SelectRequest(input=inp, choices=list(choices))
            resp = self._retry(
                lambda t: self._router.Select(sreq, timeout=t, metadata=md), deadline
            )
            return convert.selection_from_proto(resp)
        scores = self._retry(lambda t: self._worker.Score(req, timeout=t, metadata=md), deadline)
        return convert.selection_from_scores(list(choices), scores)

    def embed(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        input_ids: Sequence[int] | None = None,
        pooling: str = "mean",
        request_id: str = "",
        timeout: float | None = None,
    ) -> Embedding:
        """The prompt's final hidden states pooled ("mean" or "last"); nothing sampled."""
        inp = convert.make_input(prompt, messages, input_ids)
        kind = convert.pooling(pooling)
        deadline = Deadline(timeout if timeout is not None else self.options.timeout)
        md = self.options.metadata()
        if self._resolve() == "router":
            rreq = router_pb2.RouterEmbedRequest(input=inp, pooling=kind, request_id=request_id)
            resp = self._retry(lambda t: self._router.Embed(rreq, timeout=t, metadata=md), deadline)
            return convert.embedding_from_proto(resp.embedding, resp.worker_id)
        wreq = worker_pb2.EmbedRequest(input=inp, pooling=kind, request_id=request_id)
        wresp = self._retry(lambda t: self._worker.Embed(wreq, timeout=t, metadata=md), deadline)
        return convert.embedding_from_proto(wresp.embedding)

    # ---- control ----------------------------------------------------------------------

    def abort(self, request_id: str) -> bool:
        md = self.options.metadata()
        deadline = Deadline(self.options.timeout)
        if self._resolve() == "router":
            rreq = router_pb2.RouterAbortRequest(request_id=request_id)
            found = self._retry(
                lambda t: self._router.Abort(rreq, timeout=t, metadata=md), deadline
            )
        else:
            wreq = worker_pb2.AbortRequest(request_id=request_id)
            found = self._retry(
                lambda t: self._worker.Abort(wreq, timeout=t, metadata=md), deadline
            )
        return bool(found.found)

    def health(self, service: str = "", timeout: float | None = 5.0) -> bool:
        """True when the target reports SERVING for `service` ("" = the whole process);
        with several routers, the one this call went to."""
        try:
            resp = self._health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as e:
            if convert.server_went_away(e) or e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return False
            raise convert.error_from_rpc(e) from None
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    def model_info(self) -> ModelInfo:
        md = self.options.metadata()
        deadline = Deadline(self.options.timeout)
        if self._resolve() == "router":
            rreq = router_pb2.RouterGetModelInfoRequest()
            resp: Any = self._retry(
                lambda t: self._router.GetModelInfo(rreq, timeout=t, metadata=md), deadline
            )
        else:
            wreq = worker_pb2.GetModelInfoRequest()
            resp = self._retry(
                lambda t: self._worker.GetModelInfo(wreq, timeout=t, metadata=md), deadline
            )
        return convert.model_info_from_proto(resp.info)

    def load(self) -> Load:
        """A worker's load figures (worker targets only)."""
        md = self.options.metadata()
        req = worker_pb2.GetLoadRequest()
        resp = self._retry(
            lambda t: self._worker.GetLoad(req, timeout=t, metadata=md),
            Deadline(self.options.timeout),
        )
        return convert.load_from_proto(resp)

    def flush_cache(self) -> bool:
        """Empty the radix cache (every worker's, through a router); False if any refused
        because requests were in flight."""
        md = self.options.metadata()
        deadline = Deadline(self.options.timeout)
        if self._resolve() == "router":
            rreq = router_pb2.RouterFlushCacheRequest()
            resp: Any = self._retry(
                lambda t: self._router.FlushCache(rreq, timeout=t, metadata=md), deadline
            )
            return bool(resp.flushed == resp.total)
        wreq = worker_pb2.FlushCacheRequest()
        resp = self._retry(
            lambda t: self._worker.FlushCache(wreq, timeout=t, metadata=md), deadline
        )
        return bool(resp.flushed)

    def close(self) -> None:
        for channel in self._channels.channels():
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ---------------------------------------------------------------------

    def _resolve(self) -> Service:
        """Whether the target is a router or a worker, asked once (a router answers
        GetModelInfo). A server that went away or is still starting is asked again under
        the calls' retry policy: the first call of a new client must not fail where its
        retry would have gone to another router."""
        if self._service == "auto":
            req = router_pb2.RouterGetModelInfoRequest()
            md = self.options.metadata()
            deadline, retries = Deadline(RESOLVE_TIMEOUT_S), Retries(self.options)
            while self._service == "auto":
                try:
                    self._router.GetModelInfo(req, timeout=deadline.remaining(), metadata=md)
                    self._service = "router"
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                        self._service = "worker"
                    elif not self._wait_retry(e, retries, deadline):
                        raise convert.error_from_rpc(e) from None
        return self._service

    def _retry(self, fn: Callable[[float | None], T], deadline: Deadline) -> T:
        retries = Retries(self.options)
        while True:
            try:
                return fn(deadline.remaining())
            except grpc.RpcError as e:
                if not self._wait_retry(e, retries, deadline):
                    raise convert.error_from_rpc(e) from None

    def _wait_retry(self, e: grpc.RpcError, retries: Retries, deadline: Deadline) -> bool:
        delay = retries.wait(e)  # honours the server's retry-after
        if delay is None or not deadline.allows(delay):
            return False
        time.sleep(delay)
        return True
