from radixmesh.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouterGenerateRequest(_message.Message):
    __slots__ = ("input", "sampling_params", "request_id", "stream", "program_id", "shared_prefix_tokens")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_ID_FIELD_NUMBER: _ClassVar[int]
    SHARED_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input: _common_pb2.Input
    sampling_params: _common_pb2.SamplingParams
    request_id: str
    stream: bool
    program_id: str
    shared_prefix_tokens: int
    def __init__(self, input: _Optional[_Union[_common_pb2.Input, _Mapping]] = ..., sampling_params: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ..., stream: _Optional[bool] = ..., program_id: _Optional[str] = ..., shared_prefix_tokens: _Optional[int] = ...) -> None: ...

class RouterGenerateResponse(_message.Message):
    __slots__ = ("chunk", "worker_id", "stream_id", "offset")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    chunk: _common_pb2.GenerateChunk
    worker_id: str
    stream_id: str
    offset: int
    def __init__(self, chunk: _Optional[_Union[_common_pb2.GenerateChunk, _Mapping]] = ..., worker_id: _Optional[str] = ..., stream_id: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("stream_id", "offset")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    offset: int
    def __init__(self, stream_id: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("chunk", "worker_id", "stream_id", "offset")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    chunk: _common_pb2.GenerateChunk
    worker_id: str
    stream_id: str
    offset: int
    def __init__(self, chunk: _Optional[_Union[_common_pb2.GenerateChunk, _Mapping]] = ..., worker_id: _Optional[str] = ..., stream_id: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class SelectRequest(_message.Message):
    __slots__ = ("input", "choices")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    input: _common_pb2.Input
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, input: _Optional[_Union[_common_pb2.Input, _Mapping]] = ..., choices: _Optional[_Iterable[str]] = ...) -> None: ...

class SelectResponse(_message.Message):
    __slots__ = ("index", "text", "normalized_logprobs", "sum_logprobs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SUM_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    normalized_logprobs: _containers.RepeatedScalarFieldContainer[float]
    sum_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., normalized_logprobs: _Optional[_Iterable[float]] = ..., sum_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class RouterAbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class RouterAbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "address", "healthy", "num_running", "num_waiting", "kv_tokens_used", "kv_tokens_total", "cache_hit_rate", "cached_blocks")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    healthy: bool
    num_running: int
    num_waiting: int
    kv_tokens_used: int
    kv_tokens_total: int
    cache_hit_rate: float
    cached_blocks: int
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., healthy: _Optional[bool] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_tokens_used: _Optional[int] = ..., kv_tokens_total: _Optional[int] = ..., cache_hit_rate: _Optional[float] = ..., cached_blocks: _Optional[int] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("workers", "router_id")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    router_id: str
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., router_id: _Optional[str] = ...) -> None: ...

class RouterFlushCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RouterFlushCacheResponse(_message.Message):
    __slots__ = ("flushed", "total")
    FLUSHED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    flushed: int
    total: int
    def __init__(self, flushed: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class RouterGetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RouterGetModelInfoResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.ModelInfo
    def __init__(self, info: _Optional[_Union[_common_pb2.ModelInfo, _Mapping]] = ...) -> None: ...

class RouterEmbedRequest(_message.Message):
    __slots__ = ("input", "pooling", "request_id")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    input: _common_pb2.Input
    pooling: _common_pb2.Pooling
    request_id: str
    def __init__(self, input: _Optional[_Union[_common_pb2.Input, _Mapping]] = ..., pooling: _Optional[_Union[_common_pb2.Pooling, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class RouterEmbedResponse(_message.Message):
    __slots__ = ("embedding", "worker_id")
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    embedding: _common_pb2.Embedding
    worker_id: str
    def __init__(self, embedding: _Optional[_Union[_common_pb2.Embedding, _Mapping]] = ..., worker_id: _Optional[str] = ...) -> None: ...
