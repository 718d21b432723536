"""radixmesh.v1 messages <-> Python values for every edge that speaks protobuf: the
worker's and the router's servers and the client SDK.

Each message's fields are read here once: the client builds its own dataclasses from the
field dicts this module reads out of a message. What only the worker writes from its own
types (generated chunks, model info, load, cache events, embeddings) is written in
worker/proto_out.py, which keeps this module free of the worker's types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.grammar_key import CHOICES_SEPARATOR, grammar_key
from radixmesh.sampling_params import SamplingParams
from radixmesh.tokenizer import TokenizerLike, validate_messages
from radixmesh.v1 import common_pb2, router_pb2, worker_pb2

# Sampling fields copied as they are; the `optional` ones only when set.
_PLAIN = (
    "min_new_tokens", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos",
    "no_stop_trim", "return_logprob", "top_logprobs_num",
)  # fmt: skip
_OPTIONAL = (
    "max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty",
    "skip_special_tokens", "seed", "logprob_start_len", "speculative",
)  # fmt: skip
_CONSTRAINTS = ("regex", "json_schema", "ebnf", "structural_tag")
_DEFAULTS = SamplingParams()
FINISH_CODES = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "abort": common_pb2.FINISH_REASON_ABORT,
}
_FINISH_NAME = {v: k for k, v in FINISH_CODES.items()}
_POOLING = {"mean": common_pb2.POOLING_MEAN, "last": common_pb2.POOLING_LAST}
_POOLING_NAME: dict[int, str] = {
    common_pb2.POOLING_UNSPECIFIED: "mean",
    common_pb2.POOLING_MEAN: "mean",
    common_pb2.POOLING_LAST: "last",
}
EVENT_KIND_CODES = {  # the worker sends them (worker/proto_out.py)
    "stored": worker_pb2.CACHE_EVENT_KIND_STORED,
    "removed": worker_pb2.CACHE_EVENT_KIND_REMOVED,
    "cleared": worker_pb2.CACHE_EVENT_KIND_CLEARED,
    "pending": worker_pb2.CACHE_EVENT_KIND_PENDING,
    "offloaded": worker_pb2.CACHE_EVENT_KIND_OFFLOADED,
    "loaded": worker_pb2.CACHE_EVENT_KIND_LOADED,
    "request_started": worker_pb2.CACHE_EVENT_KIND_REQUEST_STARTED,
    "request_ended": worker_pb2.CACHE_EVENT_KIND_REQUEST_ENDED,
    "grammar_compiled": worker_pb2.CACHE_EVENT_KIND_GRAMMAR_COMPILED,
    "grammar_evicted": worker_pb2.CACHE_EVENT_KIND_GRAMMAR_EVICTED,
}

Messages = Sequence[Mapping[str, str]]
LogprobEntry = tuple[float | None, int, None]  # SGLang's (logprob, token id, None)


# ---- the prompt ---------------------------------------------------------------------------


def input_to_proto(
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


def input_ids_from_proto(
    inp: common_pb2.Input,
    tok: TokenizerLike,
    *,
    max_text_bytes: int | None = None,
    max_messages: int | None = None,
    max_token_ids: int | None = None,
) -> list[int]:
    """The request's `Input` oneof (token ids, text or chat messages) -> token ids; text
    (all messages' content together) past `max_text_bytes` UTF-8 bytes, more messages
    than `max_messages` or more token ids than `max_token_ids` are refused before they are
    validated, rendered or tokenized."""
    kind = inp.WhichOneof("kind")
    count = len(inp.messages.messages) if kind == "messages" else len(inp.token_ids.ids)
    if kind == "messages" and max_messages is not None and count > max_messages:
        raise InvalidArgument(
            "input.messages", f"{count} messages; at most {max_messages} per request"
        )
    if kind == "token_ids" and max_token_ids is not None and count > max_token_ids:
        raise InvalidArgument(
            "input.token_ids", f"{count} token ids; at most {max_token_ids} are allowed"
        )
    if max_text_bytes is not None and kind in ("text", "messages"):
        texts = [inp.text] if kind == "text" else [m.content for m in inp.messages.messages]
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        if size > max_text_bytes:
            raise InvalidArgument(
                f"input.{kind}", f"{size} bytes of text; at most {max_text_bytes} are allowed"
            )
    if kind is None:
        raise InvalidArgument("input", "empty input: set token_ids, text or messages")
    if kind == "token_ids":
        if not inp.token_ids.ids:
            raise InvalidArgument("input.token_ids", "the token id list is empty")
        return list(inp.token_ids.ids)
    if kind == "text":
        if not inp.text:
            raise InvalidArgument("input.text", "the text is empty")
        return tok.encode(inp.text)
    messages = [{"role": m.role, "content": m.content} for m in inp.messages.messages]
    try:
        checked = validate_messages(messages)
    except InvalidArgument as e:
        raise InvalidArgument("input.messages", e.message) from None
    return tok.encode_chat(checked)


# ---- sampling parameters ------------------------------------------------------------------


def params_to_proto(params: Mapping[str, Any] | SamplingParams | None) -> common_pb2.SamplingParams:
    """Validate here (the same checks as the server: a ValueError naming the field)."""
    sp = SamplingParams.from_dict(params)
    if sp.n != 1:
        raise InvalidArgument("n", "the gRPC API generates one completion per request")
    msg = common_pb2.SamplingParams(
        **{name: getattr(sp, name) for name in _PLAIN},
        stop=list(sp.stop),
        stop_regex=list(sp.stop_regex),
        stop_token_ids=list(sp.stop_token_ids),
        logit_bias=dict(sp.logit_bias),
    )
    for name in _OPTIONAL:
        value = getattr(sp, name)
        if value is not None and value != getattr(_DEFAULTS, name):
            setattr(msg, name, value)
    if sp.choices is not None:
        msg.choices.CopyFrom(common_pb2.Choices(choices=list(sp.choices)))
    for name in _CONSTRAINTS:
        if getattr(sp, name) is not None:
            setattr(msg, name, getattr(sp, name))
    return msg


def params_from_proto(p: common_pb2.SamplingParams) -> dict[str, Any]:
    params: dict[str, Any] = {name: getattr(p, name) for name in _PLAIN}
    for name in _OPTIONAL:
        if p.HasField(name):
            params[name] = getattr(p, name)
    params["stop"] = list(p.stop)
    params["stop_regex"] = list(p.stop_regex)
    params["stop_token_ids"] = list(p.stop_token_ids)
    params["logit_bias"] = dict(p.logit_bias)
    kind = p.WhichOneof("constraint")
    if kind == "choices":
        params["choices"] = list(p.choices.choices)
    elif kind is not None:
        params[kind] = getattr(p, kind)
    return params


def grammar_key_of(p: common_pb2.SamplingParams) -> int | None:
    """The key of the request's constraint (radixmesh.grammar_key), None without one: what
    the router matches against the grammars each worker announced it has compiled."""
    kind = p.WhichOneof("constraint")
    if kind is None:
        return None
    if kind == "choices":
        return grammar_key(kind, CHOICES_SEPARATOR.join(p.choices.choices))
    text: str = getattr(p, kind)
    return grammar_key(kind, text)


# ---- generated chunks ---------------------------------------------------------------------


def logprobs_fields(entries: Sequence[common_pb2.TokenLogprob]) -> list[tuple[int, float | None]]:
    """(token id, logprob or None) per entry."""
    return [(e.token_id, e.logprob if e.HasField("logprob") else None) for e in entries]


def chunk_fields(c: common_pb2.GenerateChunk) -> dict[str, Any]:
    """A chunk's fields as plain values (logprobs as `logprobs_fields` pairs)."""
    fields: dict[str, Any] = {
        "request_id": c.request_id,
        "token_ids": list(c.token_ids),
        "text": c.text,
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "cached_tokens": c.cached_tokens,
        "logprobs": logprobs_fields(c.logprobs),
        "top_logprobs": [logprobs_fields(t.tokens) for t in c.top_logprobs],
        "input_logprobs": logprobs_fields(c.input_logprobs),
        "input_top_logprobs": [logprobs_fields(t.tokens) for t in c.input_top_logprobs],
        "spec_verify_steps": c.spec_verify_steps,
        "spec_drafted_tokens": c.spec_drafted_tokens,
        "spec_accepted_tokens": c.spec_accepted_tokens,
    }
    if c.HasField("finish"):
        fields["finish_reason"] = _FINISH_NAME.get(c.finish.reason)
        fields["finish_message"] = c.finish.message
        matched = c.finish.WhichOneof("matched")
        if matched is not None:
            fields["matched_stop"] = getattr(c.finish, matched)
    return fields


# ---- the model, the load, the cache --------------------------------------------------------


def model_info_fields(m: common_pb2.ModelInfo) -> dict[str, Any]:
    return {
        "model": m.model,
        "context_length": m.context_length,
        "vocab_size": m.vocab_size,
        "page_size": m.page_size,
        "event_block_size": m.event_block_size,
        "tokenizer": m.tokenizer,
        "chat_template": m.chat_template,
        "eos_token_ids": list(m.eos_token_ids),
        "bos_token_id": m.bos_token_id if m.HasField("bos_token_id") else None,
        "hidden_size": m.hidden_size,
    }


# GetLoad's trailing metadata: the seconds since the worker's engine last answered, i.e.
# how old the load in the reply is. The worker answers from its server process without
# waiting on a busy engine (worker/load_report.py), so the answer proves the process is up,
# and this says when the engine was last heard from. Metadata rather than a field: the
# reply's fields stay what every client and router knows, and a router that gets none
# (an older worker) takes the load as fresh.
LOAD_AGE_METADATA_KEY = "radixmesh-load-age"


# Sent (as "1") in GetLoad's trailing metadata by a worker in deterministic mode: how a
# router with require_deterministic tells such workers apart. Metadata, not a proto field:
# it changes no message, and the router reads GetLoad's trailers already.
DETERMINISTIC_METADATA_KEY = "radixmesh-deterministic"


def load_age_metadata(age: float, deterministic: bool = False) -> tuple[tuple[str, str], ...]:
    age_item = (LOAD_AGE_METADATA_KEY, f"{max(age, 0.0):.3f}")
    return (age_item, (DETERMINISTIC_METADATA_KEY, "1")) if deterministic else (age_item,)


def reports_deterministic(metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
    """Whether a GetLoad reply's trailing metadata says the worker runs deterministic."""
    return any(k == DETERMINISTIC_METADATA_KEY and v in ("1", b"1") for k, v in metadata or ())


def load_age(metadata: Sequence[tuple[str, str | bytes]] | None) -> float:
    """The load age a GetLoad reply's trailing metadata carries (0: none, or unreadable)."""
    for key, value in metadata or ():
        if key == LOAD_AGE_METADATA_KEY:
            try:
                age = float(value)
            except ValueError:
                return 0.0
            return age if 0.0 <= age < float("inf") else 0.0
    return 0.0


def load_fields(m: worker_pb2.GetLoadResponse) -> dict[str, Any]:
    return {
        "num_running": m.num_running,
        "num_waiting": m.num_waiting,
        "kv_tokens_used": m.kv_tokens_used,
        "kv_tokens_total": m.kv_tokens_total,
        "cache_hit_rate": m.cache_hit_rate,
        "generation_throughput": m.generation_throughput,
        "draining": m.draining,
        "num_in_flight": m.num_in_flight,
    }


# ---- embeddings ---------------------------------------------------------------------------


def pooling_to_proto(name: str) -> common_pb2.Pooling:
    if name not in _POOLING:
        raise InvalidArgument("pooling", f"must be mean or last, got {name!r}")
    return _POOLING[name]


def pooling_from_proto(value: int) -> str:
    """The engine's name of a Pooling value ("mean" when unspecified)."""
    if value not in _POOLING_NAME:
        raise InvalidArgument("pooling", f"unknown pooling {value}")
    return _POOLING_NAME[value]


def embedding_fields(e: common_pb2.Embedding) -> dict[str, Any]:
    return {
        "values": list(e.values),
        "prompt_tokens": e.prompt_tokens,
        "cached_tokens": e.cached_tokens,
    }


# ---- scoring (select) ---------------------------------------------------------------------


def score_request(inp: common_pb2.Input, choices: Sequence[str]) -> worker_pb2.ScoreRequest:
    if not choices:
        raise InvalidArgument("choices", "the choices list is empty")
    return worker_pb2.ScoreRequest(
        input=inp, continuations=[worker_pb2.Continuation(text=c) for c in choices]
    )


def score_response(
    continuations: Sequence[list[int]], scores: Sequence[list[float]], prompt_tokens: int
) -> worker_pb2.ScoreResponse:
    return worker_pb2.ScoreResponse(
        scores=[
            worker_pb2.ContinuationScore(token_ids=ids, logprobs=lps, sum_logprob=float(sum(lps)))
            for ids, lps in zip(continuations, scores, strict=True)
        ],
        prompt_tokens=prompt_tokens,
    )


def score_sums(resp: worker_pb2.ScoreResponse) -> list[tuple[float, int]]:
    """(sum of logprobs, token count) per continuation."""
    return [(s.sum_logprob, len(s.logprobs)) for s in resp.scores]


def selection_fields(resp: router_pb2.SelectResponse) -> dict[str, Any]:
    return {
        "index": resp.index,
        "text": resp.text,
        "normalized_logprobs": list(resp.normalized_logprobs),
        "sum_logprobs": list(resp.sum_logprobs),
    }
