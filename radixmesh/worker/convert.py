"""Engine values <-> radixmesh.v1 messages, at the worker server's edge.

The engine speaks dicts (SGLang's sampling parameters, meta_info, logprob tuples); the
Worker service speaks protobuf. These functions are the one translation between them.
"""

from __future__ import annotations

from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.v1 import common_pb2, worker_pb2

# Sampling fields copied as they are; the `optional` ones only when set.
_PLAIN_FIELDS = (
    "min_new_tokens", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos",
    "no_stop_trim", "return_logprob", "top_logprobs_num",
)  # fmt: skip
_OPTIONAL_FIELDS = (
    "max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty",
    "skip_special_tokens", "seed", "logprob_start_len",
)  # fmt: skip
_FINISH = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}
_POOLING: dict[int, str] = {
    common_pb2.POOLING_UNSPECIFIED: "mean",
    common_pb2.POOLING_MEAN: "mean",
    common_pb2.POOLING_LAST: "last",
}
_EVENT_KIND = {
    "stored": worker_pb2.CACHE_EVENT_KIND_STORED,
    "removed": worker_pb2.CACHE_EVENT_KIND_REMOVED,
    "cleared": worker_pb2.CACHE_EVENT_KIND_CLEARED,
}


def pooling_name(value: int) -> str:
    """The engine's name of a Pooling value ("mean" when unspecified)."""
    if value not in _POOLING:
        raise InvalidArgument("pooling", f"unknown pooling {value}")
    return _POOLING[value]


def params_from_proto(p: common_pb2.SamplingParams) -> dict[str, Any]:
    params: dict[str, Any] = {name: getattr(p, name) for name in _PLAIN_FIELDS}
    for name in _OPTIONAL_FIELDS:
        if p.HasField(name):
            params[name] = getattr(p, name)
    params["stop"] = list(p.stop)
    params["stop_token_ids"] = list(p.stop_token_ids)
    params["logit_bias"] = dict(p.logit_bias)
    kind = p.WhichOneof("constraint")
    if kind == "choices":
        params["choices"] = list(p.choices.choices)
    elif kind is not None:
        params[kind] = getattr(p, kind)
    return params


def _logprobs(entries: list[Any]) -> list[common_pb2.TokenLogprob]:
    out = []
    for lp, tid, _ in entries:
        msg = common_pb2.TokenLogprob(token_id=tid)
        if lp is not None:
            msg.logprob = lp
        out.append(msg)
    return out


def _finish(reason: dict[str, Any]) -> common_pb2.Finish:
    msg = common_pb2.Finish(reason=_FINISH[reason["type"]], message=reason.get("message", ""))
    matched = reason.get("matched")
    if isinstance(matched, str):
        msg.matched_text = matched
    elif isinstance(matched, int):
        msg.matched_token_id = matched
    return msg


def chunk_to_proto(
    rid: str,
    token_ids: list[int],
    text: str,
    meta: dict[str, Any],
    logprobs: list[Any],
    top: list[list[Any]] | None = None,
) -> common_pb2.GenerateChunk:
    msg = common_pb2.GenerateChunk(
        request_id=rid,
        token_ids=token_ids,
        text=text,
        logprobs=_logprobs(logprobs),
        top_logprobs=[common_pb2.TopLogprobs(tokens=_logprobs(t)) for t in top or []],
        prompt_tokens=meta["prompt_tokens"],
        completion_tokens=meta["completion_tokens"],
        cached_tokens=meta["cached_tokens"],
        input_logprobs=_logprobs(meta.get("input_token_logprobs", [])),
        input_top_logprobs=[
            common_pb2.TopLogprobs(tokens=_logprobs(t)) for t in meta.get("input_top_logprobs", [])
        ],
    )
    if meta.get("finish_reason") is not None:
        msg.finish.CopyFrom(_finish(meta["finish_reason"]))
    return msg


def event_proto(epoch: int, sequence: int, event: Any) -> worker_pb2.CacheEvent:
    msg = worker_pb2.CacheEvent(
        epoch=epoch,
        sequence=sequence,
        kind=_EVENT_KIND[event.kind],
        block_hashes=list(event.block_hashes),
        num_tokens=event.num_tokens,
    )
    if event.parent_hash is not None:
        msg.parent_hash = event.parent_hash
    return msg
