"""What the client SDK returns: plain dataclasses, no protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float | None  # None for a prompt's first token


@dataclass(frozen=True)
class Chunk:
    """One streamed piece: `token_ids`, `text` and `logprobs` are deltas; counts cumulative.

    The last chunk of a stream has `finish_reason` set ("stop", "length" or "abort")."""

    request_id: str
    token_ids: list[int]
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str | None = None
    matched_stop: str | int | None = None  # the stop string or token id that ended it
    finish_message: str = ""  # why it was aborted
    logprobs: list[TokenLogprob] = field(default_factory=list)
    top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)
    worker_id: str = ""  # the worker that served it (set through a router)
    # Speculative decoding, cumulative (0 where the worker drafted nothing): steps that
    # verified drafted tokens for this request, tokens drafted, and those accepted.
    spec_verify_steps: int = 0
    spec_drafted_tokens: int = 0
    spec_accepted_tokens: int = 0
    # A resumable stream's (through a router): its id and the completion tokens delivered
    # through this chunk, what `Client.resume` takes.
    stream_id: str = ""
    offset: int = 0


@dataclass(frozen=True)
class Completion(Chunk):
    """A whole generation (the non-streaming result)."""

    input_logprobs: list[TokenLogprob] = field(default_factory=list)
    input_top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)


@dataclass(frozen=True)
class Embedding:
    """A prompt's final hidden states (after the model's last norm), pooled: the mean over
    its positions or the last position's (not normalized)."""

    values: list[float]
    prompt_tokens: int
    cached_tokens: int
    worker_id: str = ""  # the worker that computed it (set through a router)


@dataclass(frozen=True)
class Selection:
    index: int
    text: str
    normalized_logprobs: list[float]  # mean token logprob per choice (the criterion)
    sum_logprobs: list[float]


@dataclass(frozen=True)
class ModelInfo:
    model: str
    context_length: int
    vocab_size: int
    page_size: int
    event_block_size: int
    tokenizer: str
    chat_template: str
    eos_token_ids: list[int]
    bos_token_id: int | None
    hidden_size: int = 0  # an embedding's length (0: a worker that does not say)


@dataclass(frozen=True)
class Load:
    """A worker's load (GetLoad)."""

    num_running: int
    num_waiting: int
    kv_tokens_used: int
    kv_tokens_total: int
    cache_hit_rate: float
    generation_throughput: float
    draining: bool
    num_in_flight: int


@dataclass(frozen=True)
class ProgramHint:
    """Which program a request belongs to (a fork's branches, a batch's programs) and how
    many prompt tokens its requests share: a router keeps them on one worker while that
    worker's load allows (see docs/language.md). Ignored by a worker."""

    program_id: str
    shared_prefix_tokens: int = 0
