"""Python values <-> radixmesh.v1 messages, and gRPC errors -> the error catalogue."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from radixmesh.errors import (
    FIELD_METADATA_KEY,
    OVERLOADED_METADATA_KEY,
    InvalidArgument,
    Overloaded,
    RadixMeshError,
    error_from_status,
)
from radixmesh.sampling_params import SamplingParams
from radixmesh.v1 import common_pb2, router_pb2, worker_pb2

from .types import Chunk, Completion, Embedding, Load, ModelInfo, Selection, TokenLogprob

_FINISH = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}
_OPTIONAL = (
    "max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty",
    "skip_special_tokens", "seed", "logprob_start_len",
)  # fmt: skip
_PLAIN = (
    "min_new_tokens", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos",
    "no_stop_trim", "return_logprob", "top_logprobs_num",
)  # fmt: skip
_DEFAULTS = SamplingParams()


Messages = Sequence[Mapping[str, str]]


def make_input(
    prompt: str | None, messages: Messages | None, input_ids: Sequence[int] | None
) -> common_pb2.Input:
    given = [v for v in (prompt, messages, input_ids) if v is not None]
    if len(given) != 1:
        raise InvalidArgument("prompt", "give exactly one of prompt, messages and input_ids")
    if prompt is not None:
        return common_pb2.Input(text=prompt)
    if messages is not None:
        msgs = [common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in messages]
        return common_pb2.Input(messages=common_pb2.ChatMessages(messages=msgs))
    assert input_ids is not None
    return common_pb2.Input(token_ids=common_pb2.TokenIds(ids=list(input_ids)))


def make_params(params: Mapping[str, Any] | SamplingParams | None) -> common_pb2.SamplingParams:
    """Validate here (the same checks as the server: a ValueError naming the field)."""
    sp = SamplingParams.from_dict(params)
    if sp.n != 1:
        raise InvalidArgument("n", "the gRPC API generates one completion per request")
    msg = common_pb2.SamplingParams(
        **{name: getattr(sp, name) for name in _PLAIN},
        stop=list(sp.stop),
        stop_token_ids=list(sp.stop_token_ids),
        logit_bias=dict(sp.logit_bias),
    )
    for name in _OPTIONAL:
        value = getattr(sp, name)
        if value is not None and value != getattr(_DEFAULTS, name):
            setattr(msg, name, value)
    if sp.choices is not None:
        msg.choices.CopyFrom(common_pb2.Choices(choices=list(sp.choices)))
    for name in ("regex", "json_schema", "ebnf", "structural_tag"):
        if getattr(sp, name) is not None:
            setattr(msg, name, getattr(sp, name))
    return msg


def _logprobs(entries: Sequence[common_pb2.TokenLogprob]) -> list[TokenLogprob]:
    return [TokenLogprob(e.token_id, e.logprob if e.HasField("logprob") else None) for e in entries]


def chunk_fields(c: common_pb2.GenerateChunk) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "request_id": c.request_id,
        "token_ids": list(c.token_ids),
        "text": c.text,
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "cached_tokens": c.cached_tokens,
        "logprobs": _logprobs(c.logprobs),
        "top_logprobs": [_logprobs(t.tokens) for t in c.top_logprobs],
    }
    if c.HasField("finish"):
        fields["finish_reason"] = _FINISH.get(c.finish.reason)
        fields["finish_message"] = c.finish.message
        matched = c.finish.WhichOneof("matched")
        if matched is not None:
            fields["matched_stop"] = getattr(c.finish, matched)
    return fields


def served_by(resp: Any) -> str:
    """The serving worker's id: a router's responses carry it, a worker's own do not."""
    return str(getattr(resp, "worker_id", ""))


def chunk_from_proto(c: common_pb2.GenerateChunk, worker_id: str = "") -> Chunk:
    return Chunk(**chunk_fields(c), worker_id=worker_id)


def completion_from_proto(c: common_pb2.GenerateChunk, worker_id: str = "") -> Completion:
    return Completion(
        **chunk_fields(c),
        worker_id=worker_id,
        input_logprobs=_logprobs(c.input_logprobs),
        input_top_logprobs=[_logprobs(t.tokens) for t in c.input_top_logprobs],
    )


def join_chunks(chunks: Sequence[Chunk]) -> Completion:
    """A streamed generation's chunks as one Completion."""
    last = chunks[-1]
    return Completion(
        **{
            **{f.name: getattr(last, f.name) for f in dataclasses.fields(Chunk)},
            "token_ids": [t for c in chunks for t in c.token_ids],
            "text": "".join(c.text for c in chunks),
            "logprobs": [lp for c in chunks for lp in c.logprobs],
            "top_logprobs": [t for c in chunks for t in c.top_logprobs],
        }
    )


def model_info_from_proto(m: common_pb2.ModelInfo) -> ModelInfo:
    return ModelInfo(
        model=m.model,
        context_length=m.context_length,
        vocab_size=m.vocab_size,
        page_size=m.page_size,
        event_block_size=m.event_block_size,
        tokenizer=m.tokenizer,
        chat_template=m.chat_template,
        eos_token_ids=list(m.eos_token_ids),
        bos_token_id=m.bos_token_id if m.HasField("bos_token_id") else None,
        hidden_size=m.hidden_size,
    )


def load_from_proto(m: worker_pb2.GetLoadResponse) -> Load:
    return Load(
        num_running=m.num_running,
        num_waiting=m.num_waiting,
        kv_tokens_used=m.kv_tokens_used,
        kv_tokens_total=m.kv_tokens_total,
        cache_hit_rate=m.cache_hit_rate,
        generation_throughput=m.generation_throughput,
        draining=m.draining,
        num_in_flight=m.num_in_flight,
    )


_POOLING = {"mean": common_pb2.POOLING_MEAN, "last": common_pb2.POOLING_LAST}


def pooling(name: str) -> common_pb2.Pooling:
    if name not in _POOLING:
        raise InvalidArgument("pooling", f"must be mean or last, got {name!r}")
    return _POOLING[name]


def embedding_from_proto(e: common_pb2.Embedding, worker_id: str = "") -> Embedding:
    return Embedding(list(e.values), e.prompt_tokens, e.cached_tokens, worker_id)


def score_request(inp: common_pb2.Input, choices: Sequence[str]) -> worker_pb2.ScoreRequest:
    if not choices:
        raise InvalidArgument("choices", "the choices list is empty")
    return worker_pb2.ScoreRequest(
        input=inp, continuations=[worker_pb2.Continuation(text=c) for c in choices]
    )


def selection_from_scores(choices: Sequence[str], resp: worker_pb2.ScoreResponse) -> Selection:
    sums = [s.sum_logprob for s in resp.scores]
    means = [s.sum_logprob / max(len(s.logprobs), 1) for s in resp.scores]
    best = max(range(len(means)), key=lambda i: (means[i], -i))
    return Selection(best, choices[best], means, sums)


def selection_from_proto(resp: router_pb2.SelectResponse) -> Selection:
    return Selection(resp.index, resp.text, list(resp.normalized_logprobs), list(resp.sum_logprobs))


def error_from_rpc(e: grpc.RpcError) -> RadixMeshError:
    """A typed exception (the catalogue's) carrying the status name and message.

    RESOURCE_EXHAUSTED is `Overloaded` when a server said so (its retry-after metadata);
    without it gRPC itself refused a message over its size limit: an InvalidArgument, as
    no other server would take it either."""
    code: grpc.StatusCode = e.code()
    details: str = e.details() or code.name
    metadata = dict(e.trailing_metadata() or ())
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        after = metadata.get(OVERLOADED_METADATA_KEY)
        if after is None:
            return error_from_status("INVALID_ARGUMENT", f"the message is too large: {details}")
        error = error_from_status(code.name, details)
        if isinstance(error, Overloaded):
            error.retry_after = _seconds(after)
        return error
    return error_from_status(code.name, details, metadata.get(FIELD_METADATA_KEY))


def is_overloaded(e: grpc.RpcError) -> bool:
    """Whether a server refused the call for load (another may take it), not for size."""
    if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return False
    return any(k == OVERLOADED_METADATA_KEY for k, _ in e.trailing_metadata() or ())


def _seconds(text: str | bytes) -> float:
    try:
        return max(float(text), 0.0)
    except ValueError:
        return 1.0
