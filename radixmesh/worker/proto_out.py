"""The worker's own values as radixmesh.v1 messages: a step's output as a generated chunk,
its model info, load, cache events and embeddings (what only the worker writes; reading
them, and every other message, is radixmesh/wire.py's)."""

from __future__ import annotations

from collections.abc import Sequence

from radixmesh.v1 import common_pb2, worker_pb2
from radixmesh.wire import EVENT_KIND_CODES, FINISH_CODES, LogprobEntry
from radixmesh.worker.engine_info import EngineInfo
from radixmesh.worker.kvcache.events import CacheEvent
from radixmesh.worker.request_output import Finish, RequestOutput
from radixmesh.worker.stats import SchedulerStats


def _logprobs_to_proto(entries: Sequence[LogprobEntry]) -> list[common_pb2.TokenLogprob]:
    out = []
    for lp, tid, _ in entries:
        msg = common_pb2.TokenLogprob(token_id=tid)
        if lp is not None:
            msg.logprob = lp
        out.append(msg)
    return out


def _finish_to_proto(finish: Finish) -> common_pb2.Finish:
    msg = common_pb2.Finish(reason=FINISH_CODES[finish.reason], message=finish.message or "")
    if isinstance(finish.matched, str):
        msg.matched_text = finish.matched
    elif isinstance(finish.matched, int):
        msg.matched_token_id = finish.matched
    return msg


def chunk_to_proto(
    rid: str, out: RequestOutput, *, whole: bool = False
) -> common_pb2.GenerateChunk:
    """One step's output (its deltas), or with `whole` a request's outputs joined into
    one (`RequestOutput.then`), whose logprobs are then the final lists of its MetaInfo."""
    meta = out.meta_info
    logprobs = out.new_token_logprobs
    top = out.new_top_logprobs
    if whole:
        logprobs = meta.output_token_logprobs or []
        top = meta.output_top_logprobs or []
    msg = common_pb2.GenerateChunk(
        request_id=rid,
        token_ids=out.new_token_ids,
        text=out.text_delta,
        logprobs=_logprobs_to_proto(logprobs),
        top_logprobs=[common_pb2.TopLogprobs(tokens=_logprobs_to_proto(t)) for t in top],
        prompt_tokens=meta.prompt_tokens,
        completion_tokens=meta.completion_tokens,
        cached_tokens=meta.cached_tokens,
        input_logprobs=_logprobs_to_proto(meta.input_token_logprobs or []),
        input_top_logprobs=[
            common_pb2.TopLogprobs(tokens=_logprobs_to_proto(t))
            for t in meta.input_top_logprobs or []
        ],
        spec_verify_steps=meta.spec_verify_steps,
        spec_drafted_tokens=meta.spec_drafted_tokens,
        spec_accepted_tokens=meta.spec_accepted_tokens,
    )
    if meta.finish is not None:
        msg.finish.CopyFrom(_finish_to_proto(meta.finish))
    return msg


def model_info_to_proto(
    info: EngineInfo, page_size: int, event_block_size: int, chat_template: str
) -> common_pb2.ModelInfo:
    msg = common_pb2.ModelInfo(
        model=info.served_model,
        context_length=info.context_len,
        vocab_size=info.vocab_size,
        page_size=page_size,
        event_block_size=event_block_size,
        tokenizer=info.tokenizer_spec,
        chat_template=chat_template,
        eos_token_ids=sorted(info.eos_ids),
        hidden_size=info.hidden_size,
    )
    if info.bos_token_id is not None:
        msg.bos_token_id = info.bos_token_id
    return msg


def load_to_proto(
    s: SchedulerStats, throughput: float, draining: bool, in_flight: int
) -> worker_pb2.GetLoadResponse:
    return worker_pb2.GetLoadResponse(
        num_running=s.num_running,
        num_waiting=s.num_waiting,
        kv_tokens_used=s.kv_slots_used,
        kv_tokens_total=s.kv_slots_total,
        cache_hit_rate=s.cache_hit_rate,
        generation_throughput=throughput,
        draining=draining,
        num_in_flight=in_flight,
    )


def event_to_proto(epoch: int, sequence: int, event: CacheEvent) -> worker_pb2.CacheEvent:
    msg = worker_pb2.CacheEvent(
        epoch=epoch,
        sequence=sequence,
        kind=EVENT_KIND_CODES[event.kind],
        block_hashes=list(event.block_hashes),
        num_tokens=event.num_tokens,
    )
    if event.parent_hash is not None:
        msg.parent_hash = event.parent_hash
    if event.request_id:
        msg.request_id = event.request_id
    if event.grammar_keys:
        msg.grammar_keys.extend(event.grammar_keys)
    return msg


def embedding_to_proto(out: RequestOutput) -> common_pb2.Embedding:
    """An embedding request's final output (its `embedding` set) as the message."""
    assert out.embedding is not None, "not an embedding request's final output"
    return common_pb2.Embedding(
        values=out.embedding,
        prompt_tokens=out.meta_info.prompt_tokens,
        cached_tokens=out.meta_info.cached_tokens,
    )
