"""What one scheduler step produced for one request: `RequestOutput`, with its typed
`MetaInfo` and `Finish`.

No torch here: these cross into the worker's server process (which does not load the
engine's modules) over the engine pipe (`radixmesh.worker.pipe`, whose rows name every
field: a new field goes there too), and the server turns them into protobuf
(`radixmesh.wire`).
SGLang's dict shapes (`meta_info`, streamed chunks) are built from them only at the
Python API's edge: `MetaInfo.to_dict`, `RequestOutput.as_chunk`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from radixmesh.errors import RequestAborted

# SGLang's logprob entries: (logprob, token id, None); a prompt's first token has no logprob.
TokenLogprob = tuple[float, int, None]
PromptTokenLogprob = tuple[float | None, int, None]


class Delivery(enum.StrEnum):
    """Which outputs a request's sink gets (vLLM's output kinds play this part there).

    A caller that waits for a whole result needs no output per step: each one is an
    object with its meta info built on the scheduler thread and handed across threads
    (and, in the worker, across the engine pipe), for nothing (docs/performance.md,
    "Outputs to the caller")."""

    STEPS = "steps"  # each step's delta: a stream
    FIRST_AND_LAST = "first_and_last"  # the first output (the prompt is in), then the rest
    LAST = "last"  # one output when the request ends: every token and the whole text


@dataclass(frozen=True)
class Finish:
    """Why a request ended: `reason` is "stop", "length" or "abort"."""

    reason: str
    matched: str | int | None = None  # the stop string or stop token id that ended it
    length: int | None = None  # with "length": the completion tokens
    message: str | None = None  # with "abort": why (an error, a dead grammar, the client)

    def to_dict(self) -> dict[str, Any]:
        """SGLang's `finish_reason`."""
        out: dict[str, Any] = {"type": self.reason}
        if self.matched is not None:
            out["matched"] = self.matched
        if self.length is not None:
            out["length"] = self.length
        if self.message is not None:
            out["message"] = self.message
        return out


@dataclass(frozen=True)
class GrammarCounts:
    """A constrained request's jump-forward counters."""

    forced_tokens: int  # appended by jump-forward, never sampled
    jump_forwards: int
    decode_steps: int  # steps that sampled for this request


@dataclass
class MetaInfo:
    """A request's state after a step (counts cumulative). Phase times and logprob lists
    are set once it finished (logprobs only when asked for); None fields are absent from
    SGLang's dict."""

    id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish: Finish | None = None
    e2e_latency: float | None = None
    queue_time: float | None = None  # arrival to (first) admission
    prefill_time: float | None = None  # admission to the first token
    decode_time: float | None = None  # first token to the end
    num_retractions: int = 0
    grammar: GrammarCounts | None = None
    # Speculative decoding: steps that verified drafts for this request, tokens drafted,
    # and those accepted.
    spec_verify_steps: int = 0
    spec_drafted_tokens: int = 0
    spec_accepted_tokens: int = 0
    output_token_logprobs: list[TokenLogprob] | None = None
    output_top_logprobs: list[list[TokenLogprob]] | None = None
    input_token_logprobs: list[PromptTokenLogprob] | None = None
    input_top_logprobs: list[list[TokenLogprob]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """SGLang's `meta_info`."""
        info: dict[str, Any] = {
            "id": self.id,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": None if self.finish is None else self.finish.to_dict(),
        }
        for name in ("e2e_latency", "queue_time", "prefill_time", "decode_time"):
            if (value := getattr(self, name)) is not None:
                info[name] = value
        if self.num_retractions:
            info["num_retractions"] = self.num_retractions
        if self.grammar is not None:
            info["forced_tokens"] = self.grammar.forced_tokens
            info["jump_forwards"] = self.grammar.jump_forwards
            info["decode_steps"] = self.grammar.decode_steps
        if self.spec_verify_steps:  # SGLang's names; absent where nothing was drafted
            info["spec_verify_ct"] = self.spec_verify_steps
            info["spec_draft_tokens"] = self.spec_drafted_tokens
            info["spec_accepted_tokens"] = self.spec_accepted_tokens
        for name in _LOGPROB_LISTS:
            if (value := getattr(self, name)) is not None:
                info[name] = list(value)
        return info


_LOGPROB_LISTS = (
    "output_token_logprobs",
    "output_top_logprobs",
    "input_token_logprobs",
    "input_top_logprobs",
)


@dataclass
class RequestOutput:
    """What one step produced for one request (deltas), handed to the request's sink."""

    rid: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    meta_info: MetaInfo
    # Logprob deltas (SGLang's shape): (logprob, token_id, None) per new token.
    new_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    new_top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)
    error: str | None = None
    embedding: list[float] | None = None  # an embedding request's, when it finished

    def then(self, later: RequestOutput) -> RequestOutput:
        """This output and the request's next one as one: deltas joined, the later state."""
        return RequestOutput(
            rid=later.rid,
            new_token_ids=self.new_token_ids + later.new_token_ids,
            text_delta=self.text_delta + later.text_delta,
            finished=later.finished,
            meta_info=later.meta_info,
            new_token_logprobs=self.new_token_logprobs + later.new_token_logprobs,
            new_top_logprobs=self.new_top_logprobs + later.new_top_logprobs,
            error=later.error,
            embedding=later.embedding,
        )

    def as_chunk(self) -> dict[str, Any]:
        """SGLang's streamed chunk: "text" and "output_ids" are deltas."""
        chunk: dict[str, Any] = {
            "text": self.text_delta,
            "output_ids": self.new_token_ids,
            "meta_info": self.meta_info.to_dict(),
        }
        if self.new_token_logprobs:
            chunk["output_token_logprobs"] = self.new_token_logprobs
        if self.new_top_logprobs:
            chunk["output_top_logprobs"] = self.new_top_logprobs
        if self.embedding is not None:
            chunk["embedding"] = self.embedding
        return chunk


def embedding_of(out: RequestOutput) -> list[float]:
    """An embedding request's vector, from its final output; one that ended without it
    (aborted) raises RequestAborted with the reason."""
    if out.embedding is None:
        finish = out.meta_info.finish
        message = finish.message if finish is not None else None
        raise RequestAborted(message or "the embedding request was aborted")
    return out.embedding


class Accumulator:
    """A request's outputs joined: its ids and text, and its latest MetaInfo."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.text: list[str] = []
        self.meta: MetaInfo | None = None
        self.embedding: list[float] | None = None

    def add(self, out: RequestOutput) -> None:
        self.ids.extend(out.new_token_ids)
        self.text.append(out.text_delta)
        self.meta = out.meta_info
        self.embedding = out.embedding

    def result(self) -> dict[str, Any]:
        """SGLang's result dict (the Python API's edge)."""
        assert self.meta is not None
        meta = self.meta.to_dict()
        result = {"text": "".join(self.text), "output_ids": self.ids, "meta_info": meta}
        if self.embedding is not None:
            result["embedding"] = self.embedding
        return result

    def output(self) -> RequestOutput:
        """The request's outputs as one (its final state)."""
        assert self.meta is not None
        return RequestOutput(
            rid=self.meta.id,
            new_token_ids=self.ids,
            text_delta="".join(self.text),
            finished=self.meta.finish is not None,
            meta_info=self.meta,
            embedding=self.embedding,
        )
