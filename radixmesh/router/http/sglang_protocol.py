"""SGLang's native `/generate`, as plain values: parse a request, build its replies.

Parsing turns a JSON body into a `GenerateRequest` (token ids per prompt, a validated
`common_pb2.SamplingParams` per output, the logprob options); bad or unknown fields raise
`InvalidArgument` naming SGLang's field (`sampling_params.temperature`). Formatting turns
worker chunks into SGLang's output objects ({"text", "output_ids", "meta_info"}). The
HTTP handlers (sglang_api.py) do the I/O.

Fields SGLang accepts that change nothing here are ignored (`IGNORED_FIELDS`,
`IGNORED_PARAMS`); fields for what radixmesh does not serve (images, LoRA, sessions,
hidden states, ...) get a 400 naming them unless they are null / false / empty.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixmesh.client import convert
from radixmesh.errors import InvalidArgument
from radixmesh.router.limits import MAX_REQUEST_ID, check_prompt_fits, encode_within
from radixmesh.router.programs import ProgramHint, program_hint
from radixmesh.tokenizer import TokenizerLike
from radixmesh.v1 import common_pb2

# sampling_params names (SGLang's) that are ours too
_SAME = (
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "stop", "stop_token_ids",
    "ignore_eos", "skip_special_tokens", "no_stop_trim", "regex", "json_schema", "ebnf",
    "stop_regex", "speculative",
)  # fmt: skip
IGNORED_PARAMS = frozenset({"spaces_between_special_tokens", "stream_interval"})
# Accepted only when null / false / empty: what radixmesh does not serve.
_UNSERVED_PARAMS = frozenset({"structural_tag", "custom_params", "logit_bias"})
_TOP = frozenset(
    {
        "text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
        "top_logprobs_num", "return_text_in_logprobs", "stream", "rid", "program",
    }
)  # fmt: skip
IGNORED_FIELDS = frozenset(
    {"log_metrics", "no_logs", "custom_labels", "priority", "conversation_id", "routing_key"}
)
_UNSERVED = frozenset(
    {
        "input_embeds", "image_data", "video_data", "audio_data", "lora_path", "lora_id",
        "session_params", "return_hidden_states", "custom_logit_processor",
        "token_ids_logprob", "return_routed_experts", "bootstrap_host", "bootstrap_port",
        "bootstrap_room", "data_parallel_rank", "routed_dp_rank", "extra_key", "cache_salt",
    }
)  # fmt: skip
MAX_BATCH = 256
MAX_N = 16
MAX_TOP_LOGPROBS = 20
_MAX_SEED = 2**64 - 1  # the wire's uint64


@dataclass(frozen=True)
class Output:
    """One output of a request: which prompt, and how to sample it."""

    prompt: int
    params: common_pb2.SamplingParams
    return_logprob: bool
    # Prompt logprobs asked from here on (None: none); scoring with max_new_tokens 0 and
    # no start given means the whole prompt (see docs/router-http.md).
    logprob_start_len: int | None
    prefill_only: bool  # max_new_tokens 0: the worker samples one token, dropped here


@dataclass(frozen=True)
class GenerateRequest:
    prompts: list[list[int]]
    outputs: list[Output]  # prompt-major, n per prompt
    batch: bool  # a list came in, so a list goes out
    stream: bool
    text_in_logprobs: bool
    rids: list[str] | None
    program: ProgramHint | None = None  # radixmesh's `program` field (program-aware routing)


def parse_generate(
    body: Any, tokenizer: TokenizerLike, context_length: int | None = None
) -> GenerateRequest:
    """`context_length`: the model's; a prompt that fills it is refused naming `text` or
    `input_ids` (each generates at least one token: max_new_tokens 0 is a prefill of 1)."""
    if not isinstance(body, dict):
        raise InvalidArgument("body", "the request body must be a JSON object")
    _check_fields(body)
    prompts, batch = _prompts(body, tokenizer, context_length)
    if context_length is not None:
        name = "text" if body.get("text") is not None else "input_ids"
        for i, ids in enumerate(prompts):
            check_prompt_fits(f"{name}[{i}]" if batch else name, len(ids), context_length, 1)
    count = len(prompts)
    sampling = _per_prompt(body.get("sampling_params"), count, "sampling_params", None)
    want_lp = _per_prompt(body.get("return_logprob"), count, "return_logprob", False)
    starts = _per_prompt(body.get("logprob_start_len"), count, "logprob_start_len", None)
    tops = _per_prompt(body.get("top_logprobs_num"), count, "top_logprobs_num", None)
    outputs: list[Output] = []
    for i in range(count):
        params = _sampling(sampling[i])
        n = _int(params.pop("n", 1), "sampling_params.n", 1, MAX_N)
        lp = _bool(want_lp[i], "return_logprob")
        outputs += _outputs(i, params, n, lp, starts[i], tops[i])
    if len({o.prompt for o in outputs}) != count or (len(outputs) > 1 and not batch):
        batch = True
    rids = _rids(body.get("rid"), len(outputs))
    text = _bool(body.get("return_text_in_logprobs", False), "return_text_in_logprobs")
    stream = _bool(body.get("stream", False), "stream")
    return GenerateRequest(prompts, outputs, batch, stream, text, rids, _program(body))


def _program(body: Mapping[str, Any]) -> ProgramHint | None:
    """radixmesh's optional `program`: {"program_id": str, "shared_prefix_tokens": int}."""
    raw = body.get("program")
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"program_id", "shared_prefix_tokens"}:
        raise InvalidArgument("program", "an object with program_id and shared_prefix_tokens")
    pid = raw.get("program_id")
    if not isinstance(pid, str) or not pid:
        raise InvalidArgument("program.program_id", "must be a non-empty string")
    tokens = _int(raw.get("shared_prefix_tokens", 0), "program.shared_prefix_tokens", 0, 1 << 31)
    return program_hint(pid, tokens)


def _check_fields(body: Mapping[str, Any]) -> None:
    for name, value in body.items():
        if name in _UNSERVED and value not in (None, False, [], {}, ""):
            raise InvalidArgument(name, f"{name!r} is not served by radixmesh (text models only)")
        if name not in _TOP | IGNORED_FIELDS | _UNSERVED:
            raise InvalidArgument(name, f"unknown field {name!r}")
    if body.get("text") is not None and body.get("input_ids") is not None:
        raise InvalidArgument("text", "give text or input_ids, not both")


def _prompts(
    body: Mapping[str, Any], tok: TokenizerLike, context_length: int | None
) -> tuple[list[list[int]], bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if text is not None:
        batch = isinstance(text, list)
        items = text if batch else [text]
        if not items or not all(isinstance(t, str) and t for t in items):
            raise InvalidArgument("text", "give a non-empty string or a list of them")
        _cap(len(items), "text")
        if context_length is None:
            return [tok.encode(t) for t in items], batch
        names = [f"text[{i}]" if batch else "text" for i in range(len(items))]
        return [
            encode_within(tok.encode, t, context_length, n)
            for t, n in zip(items, names, strict=True)
        ], batch
    if ids is None:
        raise InvalidArgument("text", "give text or input_ids")
    batch = isinstance(ids, list) and bool(ids) and all(isinstance(x, list) for x in ids)
    items = ids if batch else [ids]
    for seq in items:
        if not isinstance(seq, list) or not seq or not all(_is_id(t) for t in seq):
            raise InvalidArgument(
                "input_ids", "give a non-empty list of token ids, or a list of them"
            )
    _cap(len(items), "input_ids")
    return [list(seq) for seq in items], batch


def _cap(count: int, name: str) -> None:
    if count > MAX_BATCH:
        raise InvalidArgument(name, f"at most {MAX_BATCH} prompts per request, got {count}")


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def _per_prompt(value: Any, count: int, name: str, default: Any) -> list[Any]:
    """One value per prompt, from a single value or a list of `count`."""
    if isinstance(value, list) and (name != "sampling_params" or count > 1 or value):
        if len(value) != count:
            raise InvalidArgument(name, f"a list of {len(value)} for {count} prompts")
        return [default if v is None else v for v in value]
    return [default if value is None else value] * count


def _sampling(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidArgument("sampling_params", "must be an object (or a list of them)")
    params: dict[str, Any] = {}
    for key, value in raw.items():
        if key in IGNORED_PARAMS or value is None:
            continue
        if key in _UNSERVED_PARAMS:
            if value not in ("", [], (), {}):
                raise InvalidArgument(f"sampling_params.{key}", f"{key} is not supported")
        elif key in _SAME or key == "n":
            params[key] = value
        elif key == "sampling_seed":
            params["seed"] = value
        else:
            raise InvalidArgument(f"sampling_params.{key}", f"unknown sampling parameter {key!r}")
    if isinstance(params.get("json_schema"), dict):
        params["json_schema"] = json.dumps(params["json_schema"])
    return params


def _outputs(
    prompt: int,
    params: dict[str, Any],
    n: int,
    return_logprob: bool,
    start: Any,
    top: Any,
) -> list[Output]:
    prefill_only = params.get("max_new_tokens") == 0
    if return_logprob:
        if start is not None:
            start = _int(start, "logprob_start_len", -1, 1 << 31)
            start = None if start == -1 else start
        elif prefill_only:
            start = 0
        if top is not None:
            params["top_logprobs_num"] = _int(top, "top_logprobs_num", 0, MAX_TOP_LOGPROBS)
        params["return_logprob"] = True
        params["logprob_start_len"] = start
    else:
        start = None
    if prefill_only:
        params["max_new_tokens"] = 1
    seed = params.get("seed")
    if seed is not None:  # checked before `seed + j`: a list or a string there was a 500
        _int(seed, "sampling_params.sampling_seed", 0, _MAX_SEED)
    outputs = []
    for j in range(n):
        p = dict(params)
        if seed is not None:
            p["seed"] = (seed + j) % (_MAX_SEED + 1)  # n samples of one seed must differ
        outputs.append(Output(prompt, _to_proto(p), return_logprob, start, prefill_only))
    return outputs


def sglang_field(field: str) -> str:
    """The name SGLang's /generate gives a field our validation named."""
    name = field.removeprefix("sampling_params.")
    if name in ("return_logprob", "logprob_start_len", "top_logprobs_num"):
        return name
    if name == "seed":
        return "sampling_params.sampling_seed"
    if name in _SAME or name == "n":
        return f"sampling_params.{name}"
    return field


def _to_proto(params: dict[str, Any]) -> common_pb2.SamplingParams:
    try:
        return convert.make_params(params)
    except InvalidArgument as e:
        raise InvalidArgument(sglang_field(e.field), e.message) from None


def _rids(raw: Any, count: int) -> list[str] | None:
    if raw is None:
        return None
    rids = raw if isinstance(raw, list) else [raw]
    if len(rids) != count or not all(isinstance(r, str) and r for r in rids):
        raise InvalidArgument("rid", f"give one non-empty request id per output ({count})")
    if any(len(r) > MAX_REQUEST_ID for r in rids):  # as gRPC's request_id
        raise InvalidArgument("rid", f"at most {MAX_REQUEST_ID} characters")
    return list(rids)


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgument(name, f"must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(name, f"must be true or false, got {value!r}")
    return value


# ---- replies --------------------------------------------------------------------------------


class OutputState:
    """One output's text, ids and logprobs as its chunks arrive (SGLang's stream events
    carry the whole text so far, so it is kept)."""

    def __init__(self, req: GenerateRequest, index: int, rid: str, tok: TokenizerLike) -> None:
        self.req = req
        self.tok = tok
        self.out = req.outputs[index]
        self.index = index
        self.rid = rid
        self.text = ""
        self.ids: list[int] = []
        self.logprobs: list[list[Any]] = []
        self.top_logprobs: list[list[list[Any]]] = []
        self.last: common_pb2.GenerateChunk | None = None
        self.worker_id = ""

    def add(self, chunk: common_pb2.GenerateChunk, worker_id: str) -> None:
        self.last, self.worker_id = chunk, worker_id
        if self.out.prefill_only:
            return
        self.text += chunk.text
        self.ids += list(chunk.token_ids)
        if self.out.return_logprob:
            self.logprobs += [self._entry(e) for e in chunk.logprobs]
            self.top_logprobs += [[self._entry(a) for a in t.tokens] for t in chunk.top_logprobs]

    def to_json(self, e2e_latency: float) -> dict[str, Any]:
        chunk = self.last
        assert chunk is not None
        done = chunk.HasField("finish")
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": _finish(chunk, self.out.prefill_only) if done else None,
            "prompt_tokens": chunk.prompt_tokens,
            "completion_tokens": 0 if self.out.prefill_only else chunk.completion_tokens,
            "cached_tokens": chunk.cached_tokens,
            "e2e_latency": e2e_latency,
            "worker_id": self.worker_id,
        }
        if chunk.spec_verify_steps:  # absent where nothing was drafted, as in SGLang
            meta["spec_verify_ct"] = chunk.spec_verify_steps
            meta["spec_draft_tokens"] = chunk.spec_drafted_tokens
            meta["spec_accepted_tokens"] = chunk.spec_accepted_tokens
        if self.out.return_logprob:
            meta["output_token_logprobs"] = self.logprobs
            meta["output_top_logprobs"] = self.top_logprobs
            if self.out.logprob_start_len is not None:
                meta["input_token_logprobs"] = (
                    [self._entry(e) for e in chunk.input_logprobs] if done else []
                )
                meta["input_top_logprobs"] = None
        out: dict[str, Any] = {"text": self.text, "output_ids": self.ids, "meta_info": meta}
        if self.req.batch:
            out["index"] = self.index
        return out

    def _entry(self, e: common_pb2.TokenLogprob) -> list[Any]:
        """SGLang's [logprob, token id, token text or None]."""
        lp = e.logprob if e.HasField("logprob") else None
        text = None
        if self.req.text_in_logprobs:
            text = self.tok.decode([e.token_id], skip_special_tokens=False)
        return [lp, e.token_id, text]


_FINISH = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}


def _finish(chunk: common_pb2.GenerateChunk, prefill_only: bool) -> dict[str, Any]:
    f = chunk.finish
    if prefill_only and f.reason != common_pb2.FINISH_REASON_ABORT:
        return {"type": "length", "length": 0}
    reason: dict[str, Any] = {"type": _FINISH.get(f.reason, "abort")}
    matched = f.WhichOneof("matched")
    if matched is not None:
        reason["matched"] = getattr(f, matched)
    if f.reason == common_pb2.FINISH_REASON_LENGTH:
        reason["length"] = chunk.completion_tokens
    if f.message:
        reason["message"] = f.message
    return reason


def outputs_json(states: Sequence[OutputState], req: GenerateRequest, e2e: float) -> Any:
    body = [s.to_json(e2e) for s in states]
    return body if req.batch else body[0]
