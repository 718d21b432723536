from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]

class Pooling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOLING_UNSPECIFIED: _ClassVar[Pooling]
    POOLING_MEAN: _ClassVar[Pooling]
    POOLING_LAST: _ClassVar[Pooling]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
POOLING_UNSPECIFIED: Pooling
POOLING_MEAN: Pooling
POOLING_LAST: Pooling

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class Input(_message.Message):
    __slots__ = ("token_ids", "text", "messages")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    token_ids: TokenIds
    text: str
    messages: ChatMessages
    def __init__(self, token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., text: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("choices",)
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "no_stop_trim", "seed", "return_logprob", "top_logprobs_num", "logprob_start_len", "regex", "json_schema", "ebnf", "choices", "structural_tag", "logit_bias", "stop_regex", "speculative")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NO_STOP_TRIM_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_NUM_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_START_LEN_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    EBNF_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    STRUCTURAL_TAG_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    STOP_REGEX_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    min_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    skip_special_tokens: bool
    no_stop_trim: bool
    seed: int
    return_logprob: bool
    top_logprobs_num: int
    logprob_start_len: int
    regex: str
    json_schema: str
    ebnf: str
    choices: Choices
    structural_tag: str
    logit_bias: _containers.ScalarMap[int, float]
    stop_regex: _containers.RepeatedScalarFieldContainer[str]
    speculative: bool
    def __init__(self, max_new_tokens: _Optional[int] = ..., min_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., no_stop_trim: _Optional[bool] = ..., seed: _Optional[int] = ..., return_logprob: _Optional[bool] = ..., top_logprobs_num: _Optional[int] = ..., logprob_start_len: _Optional[int] = ..., regex: _Optional[str] = ..., json_schema: _Optional[str] = ..., ebnf: _Optional[str] = ..., choices: _Optional[_Union[Choices, _Mapping]] = ..., structural_tag: _Optional[str] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., stop_regex: _Optional[_Iterable[str]] = ..., speculative: _Optional[bool] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class TopLogprobs(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, tokens: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class Finish(_message.Message):
    __slots__ = ("reason", "matched_text", "matched_token_id", "message")
    REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TEXT_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    reason: FinishReason
    matched_text: str
    matched_token_id: int
    message: str
    def __init__(self, reason: _Optional[_Union[FinishReason, str]] = ..., matched_text: _Optional[str] = ..., matched_token_id: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "logprobs", "top_logprobs", "prompt_tokens", "completion_tokens", "cached_tokens", "finish", "input_logprobs", "input_top_logprobs", "spec_verify_steps", "spec_drafted_tokens", "spec_accepted_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    INPUT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SPEC_VERIFY_STEPS_FIELD_NUMBER: _ClassVar[int]
    SPEC_DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPEC_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprobs]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish: Finish
    input_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    input_top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprobs]
    spec_verify_steps: int
    spec_drafted_tokens: int
    spec_accepted_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., top_logprobs: _Optional[_Iterable[_Union[TopLogprobs, _Mapping]]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., finish: _Optional[_Union[Finish, _Mapping]] = ..., input_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., input_top_logprobs: _Optional[_Iterable[_Union[TopLogprobs, _Mapping]]] = ..., spec_verify_steps: _Optional[int] = ..., spec_drafted_tokens: _Optional[int] = ..., spec_accepted_tokens: _Optional[int] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values", "prompt_tokens", "cached_tokens")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    prompt_tokens: int
    cached_tokens: int
    def __init__(self, values: _Optional[_Iterable[float]] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "context_length", "vocab_size", "page_size", "event_block_size", "tokenizer", "chat_template", "eos_token_ids", "bos_token_id", "hidden_size")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    EVENT_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    model: str
    context_length: int
    vocab_size: int
    page_size: int
    event_block_size: int
    tokenizer: str
    chat_template: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bos_token_id: int
    hidden_size: int
    def __init__(self, model: _Optional[str] = ..., context_length: _Optional[int] = ..., vocab_size: _Optional[int] = ..., page_size: _Optional[int] = ..., event_block_size: _Optional[int] = ..., tokenizer: _Optional[str] = ..., chat_template: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., bos_token_id: _Optional[int] = ..., hidden_size: _Optional[int] = ...) -> None: ...
