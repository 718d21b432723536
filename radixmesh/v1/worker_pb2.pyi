from radixmesh.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CacheEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_EVENT_KIND_UNSPECIFIED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_STORED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_REMOVED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_CLEARED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_PENDING: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_OFFLOADED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_LOADED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_REQUEST_STARTED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_REQUEST_ENDED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_GRAMMAR_COMPILED: _ClassVar[CacheEventKind]
    CACHE_EVENT_KIND_GRAMMAR_EVICTED: _ClassVar[CacheEventKind]
CACHE_EVENT_KIND_UNSPECIFIED: CacheEventKind
CACHE_EVENT_KIND_STORED: CacheEventKind
CACHE_EVENT_KIND_REMOVED: CacheEventKind
CACHE_EVENT_KIND_CLEARED: CacheEventKind
CACHE_EVENT_KIND_PENDING: CacheEventKind
CACHE_EVENT_KIND_OFFLOADED: CacheEventKind
CACHE_EVENT_KIND_LOADED: CacheEventKind
CACHE_EVENT_KIND_REQUEST_STARTED: CacheEventKind
CACHE_EVENT_KIND_REQUEST_ENDED: CacheEventKind
CACHE_EVENT_KIND_GRAMMAR_COMPILED: CacheEventKind
CACHE_EVENT_KIND_GRAMMAR_EVICTED: CacheEventKind

class GenerateRequest(_message.Message):
    __slots__ = ("input", "sampling_params", "request_id", "stream", "first_and_rest", "output_stream", "resumable", "owner", "resume_from")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FIRST_AND_REST_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_STREAM_FIELD_NUMBER: _ClassVar[int]
    RESUMABLE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    input: _common_pb2.Input
    sampling_params: _common_pb2.SamplingParams
    request_id: str
    stream: bool
    first_and_rest: bool
    output_stream: str
    resumable: bool
    owner: str
    resume_from: ResumeFrom
    def __init__(self, input: _Optional[_Union[_common_pb2.Input, _Mapping]] = ..., sampling_params: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ..., stream: _Optional[bool] = ..., first_and_rest: _Optional[bool] = ..., output_stream: _Optional[str] = ..., resumable: _Optional[bool] = ..., owner: _Optional[str] = ..., resume_from: _Optional[_Union[ResumeFrom, _Mapping]] = ...) -> None: ...

class ResumeFrom(_message.Message):
    __slots__ = ("request_id", "offset")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    offset: int
    def __init__(self, request_id: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class StreamOutputsRequest(_message.Message):
    __slots__ = ("stream_id",)
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    def __init__(self, stream_id: _Optional[str] = ...) -> None: ...

class StreamOutputsResponse(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[_common_pb2.GenerateChunk]
    def __init__(self, chunks: _Optional[_Iterable[_Union[_common_pb2.GenerateChunk, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("chunk",)
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chunk: _common_pb2.GenerateChunk
    def __init__(self, chunk: _Optional[_Union[_common_pb2.GenerateChunk, _Mapping]] = ...) -> None: ...

class Continuation(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _common_pb2.TokenIds
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[_common_pb2.TokenIds, _Mapping]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("input", "continuations")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    CONTINUATIONS_FIELD_NUMBER: _ClassVar[int]
    input: _common_pb2.Input
    continuations: _containers.RepeatedCompositeFieldContainer[Continuation]
    def __init__(self, input: _Optional[_Union[_common_pb2.Input, _Mapping]] = ..., continuations: _Optional[_Iterable[_Union[Continuation, _Mapping]]] = ...) -> None: ...

class ContinuationScore(_message.Message):
    __slots__ = ("token_ids", "logprobs", "sum_logprob")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SUM_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    sum_logprob: float
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., sum_logprob: _Optional[float] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "prompt_tokens")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[ContinuationScore]
    prompt_tokens: int
    def __init__(self, scores: _Optional[_Iterable[_Union[ContinuationScore, _Mapping]]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLoadResponse(_message.Message):
    __slots__ = ("num_running", "num_waiting", "kv_tokens_used", "kv_tokens_total", "cache_hit_rate", "generation_throughput", "draining", "num_in_flight")
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    NUM_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    kv_tokens_used: int
    kv_tokens_total: int
    cache_hit_rate: float
    generation_throughput: float
    draining: bool
    num_in_flight: int
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_tokens_used: _Optional[int] = ..., kv_tokens_total: _Optional[int] = ..., cache_hit_rate: _Optional[float] = ..., generation_throughput: _Optional[float] = ..., draining: _Optional[bool] = ..., num_in_flight: _Optional[int] = ...) -> None: ...

class StreamCacheEventsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CacheEvent(_message.Message):
    __slots__ = ("epoch", "sequence", "kind", "block_hashes", "parent_hash", "num_tokens", "request_id", "grammar_keys")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_KEYS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    sequence: int
    kind: CacheEventKind
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    parent_hash: int
    num_tokens: int
    request_id: str
    grammar_keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, epoch: _Optional[int] = ..., sequence: _Optional[int] = ..., kind: _Optional[_Union[CacheEventKind, str]] = ..., block_hashes: _Optional[_Iterable[int]] = ..., parent_hash: _Optional[int] = ..., num_tokens: _Optional[int] = ..., request_id: _Optional[str] = ..., grammar_keys: _Optional[_Iterable[int]] = ...) -> None: ...

class StreamCacheEventsResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: CacheEvent
    def __init__(self, event: _Optional[_Union[CacheEvent, _Mapping]] = ...) -> None: ...

class GetCacheSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCacheSnapshotResponse(_message.Message):
    __slots__ = ("epoch", "sequence", "block_size", "events")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    sequence: int
    block_size: int
    events: _containers.RepeatedCompositeFieldContainer[CacheEvent]
    def __init__(self, epoch: _Optional[int] = ..., sequence: _Optional[int] = ..., block_size: _Optional[int] = ..., events: _Optional[_Iterable[_Union[CacheEvent, _Mapping]]] = ...) -> None: ...

class FlushCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushCacheResponse(_message.Message):
    __slots__ = ("flushed",)
    FLUSHED_FIELD_NUMBER: _ClassVar[int]
    flushed: bool
    def __init__(self, flushed: _Optional[bool] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: _common_pb2.ModelInfo
    def __init__(self, info: _Optional[_Union[_common_pb2.ModelInfo, _Mapping]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("input", "pooling", "request_id")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    input: _common_pb2.Input
    pooling: _common_pb2.Pooling
    request_id: str
    def __init__(self, input: _Optional[_Union[_common_pb2.Input, _Mapping]] = ..., pooling: _Optional[_Union[_common_pb2.Pooling, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embedding",)
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    embedding: _common_pb2.Embedding
    def __init__(self, embedding: _Optional[_Union[_common_pb2.Embedding, _Mapping]] = ...) -> None: ...

class PutStoredResponseRequest(_message.Message):
    __slots__ = ("caller", "response_id", "entry", "ttl_seconds")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    caller: str
    response_id: str
    entry: bytes
    ttl_seconds: float
    def __init__(self, caller: _Optional[str] = ..., response_id: _Optional[str] = ..., entry: _Optional[bytes] = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class PutStoredResponseResponse(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: bool
    def __init__(self, stored: _Optional[bool] = ...) -> None: ...

class GetStoredResponseRequest(_message.Message):
    __slots__ = ("caller", "response_id")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    caller: str
    response_id: str
    def __init__(self, caller: _Optional[str] = ..., response_id: _Optional[str] = ...) -> None: ...

class GetStoredResponseResponse(_message.Message):
    __slots__ = ("found", "entry")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    found: bool
    entry: bytes
    def __init__(self, found: _Optional[bool] = ..., entry: _Optional[bytes] = ...) -> None: ...

class DeleteStoredResponseRequest(_message.Message):
    __slots__ = ("caller", "response_id")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    caller: str
    response_id: str
    def __init__(self, caller: _Optional[str] = ..., response_id: _Optional[str] = ...) -> None: ...

class DeleteStoredResponseResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...
