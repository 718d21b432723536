"""Turns sampled tokens into request results: stop checks, text, logprobs, deltas.

The scheduler calls `append_token` for every sampled token and `emit` once per step per
request; `emit` hands the step's delta (new ids, new text, new logprobs) to the
request's sink, and the request's `MetaInfo` with it. A request that does not stream
(`Request.delivery`) gets one output when it ends, or its first and then one when it
ends: its deltas gather meanwhile.
"""

from __future__ import annotations

import time
from typing import Any

from radixmesh.worker.batch import PromptLogprobs
from radixmesh.worker.detokenizer import IncrementalDetokenizer
from radixmesh.worker.request import FinishReason, Request
from radixmesh.worker.request_output import Delivery, Finish, MetaInfo, RequestOutput


class OutputProcessor:
    def __init__(self, context_len: int) -> None:
        self.context_len = context_len
        # rid -> (ids, text, logprobs, top logprobs) not yet emitted
        self._pending: dict[str, tuple[list[int], list[str], list[Any], list[Any]]] = {}

    def _buf(self, req: Request) -> tuple[list[int], list[str], list[Any], list[Any]]:
        # Not setdefault: that would build four lists per token only to drop them.
        buf = self._pending.get(req.rid)
        if buf is None:
            buf = self._pending[req.rid] = ([], [], [], [])
        return buf

    def append_token(
        self,
        req: Request,
        token: int,
        logprob: float | None,
        top: list[tuple[int, float]] | None,
    ) -> None:
        # Per sampled token: fields rather than properties, and the finish checks only
        # when one of them can hold (most tokens end nothing).
        all_ids = req.token_ids
        all_ids.append(token)
        buf = self._pending.get(req.rid)  # `_buf`, inlined (as `_text_later` below)
        if buf is None:
            buf = self._pending[req.rid] = ([], [], [], [])
        ids, text, lps, tops = buf
        ids.append(token)
        params = req.params
        if params.return_logprob:
            entry = (float(logprob) if logprob is not None else 0.0, token, None)
            req.output_token_logprobs.append(entry)
            lps.append(entry)
            if req.params.top_logprobs_num:
                top_entry = [(float(lp), int(t), None) for t, lp in (top or [])]
                req.output_top_logprobs.append(top_entry)
                tops.append(top_entry)
        # A matched stop token stays in output_ids but not in the text (SGLang's
        # convention), unless no_stop_trim asks to keep it.
        num_output = len(all_ids) - req.num_prompt_tokens
        stop_token = token in req.stop_ids and num_output >= params.min_new_tokens
        detok = req.detokenizer
        if detok is not None and (not stop_token or params.no_stop_trim):
            if _text_later(req, detok):
                detok.defer_token(token)
            else:
                text.append(detok.push([token]))
        if (
            stop_token
            or num_output >= params.max_new_tokens
            or len(all_ids) >= self.context_len
            # Only a stop string or regex ends the text (`ended`): not asked without one.
            or (detok is not None and detok.has_stops and detok.ended)
        ):
            self._check_finish(req, token, stop_token)
        if req.finish_reason is not None and detok is not None:
            text.append(detok.finish())

    def append_forced(self, req: Request, tokens: list[int]) -> None:
        """Tokens a grammar forced (jump-forward: no logprob), with the same result as
        `append_token` one at a time, but in one detokenizer push when nothing can end
        the request before the last of them: no stop token or stop string among them,
        no logprobs, and room for all under max_new_tokens and the context length. A
        jump appends ~10 tokens; one at a time they cost ~10 us each on the H200's host."""
        detok = req.detokenizer
        params = req.params
        room = min(params.max_new_tokens - req.num_output_tokens, self.context_len - req.num_tokens)
        if (
            len(tokens) > room
            or params.return_logprob
            or (detok is not None and detok.has_stops)
            or not req.stop_ids.isdisjoint(tokens)
        ):
            for t in tokens:
                self.append_token(req, t, None, None)
                if req.finished:
                    return
            return
        req.token_ids.extend(tokens)
        ids, text, _, _ = self._buf(req)
        ids.extend(tokens)
        if detok is not None:
            if _text_later(req, detok):
                detok.defer(tokens)
            else:
                text.append(detok.push(tokens))
        self._check_finish(req, tokens[-1], False)
        if req.finished and detok is not None:
            text.append(detok.finish())

    def _check_finish(self, req: Request, token: int, stop_token: bool) -> None:
        params = req.params
        n_out = req.num_output_tokens
        if stop_token:
            req.finish(FinishReason.STOP, token)
        elif req.detokenizer is not None and req.detokenizer.matched_stop is not None:
            req.finish(FinishReason.STOP, req.detokenizer.matched_stop)
        elif req.detokenizer is not None and req.detokenizer.error is not None:
            req.error = req.detokenizer.error  # a stop regex too slow to search
            req.finish(FinishReason.ABORT)
        elif n_out >= params.max_new_tokens or req.num_tokens >= self.context_len:
            req.finish(FinishReason.LENGTH)

    def add_prompt_logprobs(self, req: Request, plp: PromptLogprobs) -> None:
        start = req.params.logprob_start_len or 0
        have = len(req.input_token_logprobs)
        if start == 0 and have == 0:
            req.input_token_logprobs.append((None, req.token_ids[0], None))
            if req.params.top_logprobs_num:
                req.input_top_logprobs.append([])
            have = 1
        for i, lp in enumerate(plp.logprobs):
            pos = plp.first + i  # the position of the scored token
            if pos - start != have:  # already recorded (a chunk seen before a retraction)
                continue
            req.input_token_logprobs.append((lp, req.token_ids[pos], None))
            if req.params.top_logprobs_num:
                req.input_top_logprobs.append(
                    [(float(v), int(t), None) for t, v in (plp.top[i] if plp.top else [])]
                )
            have += 1

    def emit(self, req: Request) -> None:
        finished = req.finish_reason is not None
        delivery = req.delivery
        if (
            not finished
            and delivery is not Delivery.STEPS
            and (delivery is Delivery.LAST or req.outputs_sent)
        ):
            return  # the deltas stay pending until the request ends
        detok = req.detokenizer
        if detok is not None and detok.deferred:  # ended without `finish` (an abort)
            self._buf(req)[1].append(detok.push(()))
        buf = self._pending.pop(req.rid, None)
        if (buf is None or not buf[0]) and not finished:
            return
        sink = req.sink
        if sink is None:
            return
        ids, text, lps, tops = buf or ([], [], [], [])
        req.outputs_sent += 1
        sink(
            RequestOutput(
                rid=req.rid,
                new_token_ids=ids,
                text_delta=text[0] if len(text) == 1 else "".join(text),
                finished=finished,
                meta_info=meta_info(req),
                new_token_logprobs=lps,
                new_top_logprobs=tops,
                error=req.error,
                embedding=_embedding(req) if req.hidden_pool is not None else None,
            )
        )


def _text_later(req: Request, detok: IncrementalDetokenizer) -> bool:
    """Whether a token's text may wait (`IncrementalDetokenizer.defer`) until the request
    ends: its output is sent only then (`emit`), and nothing before reads the text: no stop
    strings, no grammar (whose stop is not an `append_token` finish, which decodes what
    waits). The whole text is the same; a decode per token is saved (two calls of the
    tokenizer's decode each), what a step of 256 non-streaming requests spent most of its
    per-token output time in."""
    delivery = req.delivery
    return (
        (
            delivery is Delivery.LAST
            or (delivery is Delivery.FIRST_AND_LAST and req.outputs_sent > 0)
        )
        and not detok.has_stops
        and req.grammar is None
    )


def _phase_times(req: Request, now: float) -> dict[str, float]:
    """Seconds spent waiting for admission, in prefill (admission to the first token) and
    in decode (first token to the end), for the phases the request reached."""
    if req.admit_time is None:
        return {"queue_time": now - req.arrival_time}
    times = {"queue_time": req.admit_time - req.arrival_time}
    if req.first_token_time is not None:
        times["prefill_time"] = req.first_token_time - req.admit_time
        times["decode_time"] = now - req.first_token_time
    return times


def _embedding(req: Request) -> list[float] | None:
    pool = req.hidden_pool
    if pool is None or not req.finished or req.error is not None or pool.total is None:
        return None
    return pool.vector()


def finish_of(req: Request) -> Finish | None:
    if req.finish_reason is None:
        return None
    length = req.num_output_tokens if req.finish_reason is FinishReason.LENGTH else None
    return Finish(req.finish_reason.value, req.matched_stop, length, req.error)


def meta_info(req: Request) -> MetaInfo:
    finished = req.finish_reason is not None
    info = MetaInfo(
        id=req.rid,
        prompt_tokens=req.num_prompt_tokens,
        completion_tokens=len(req.token_ids) - req.num_prompt_tokens,
        cached_tokens=req.num_cached_tokens,
        finish=finish_of(req) if finished else None,
        num_retractions=req.num_retractions,
        grammar=None if req.grammar is None else req.grammar.counts(),
        spec_verify_steps=req.spec_verify_steps,
        spec_drafted_tokens=req.spec_drafted_tokens,
        spec_accepted_tokens=req.spec_accepted_tokens,
    )
    if finished:
        now = time.monotonic()
        info.e2e_latency = now - req.arrival_time
        for name, seconds in _phase_times(req, now).items():
            setattr(info, name, seconds)
        # Full logprob lists only on the final message; streamed chunks carry their deltas.
        params = req.params
        if params.return_logprob:
            info.output_token_logprobs = list(req.output_token_logprobs)
            if params.top_logprobs_num:
                info.output_top_logprobs = list(req.output_top_logprobs)
            if params.logprob_start_len is not None:
                info.input_token_logprobs = list(req.input_token_logprobs)
                if params.top_logprobs_num:
                    info.input_top_logprobs = list(req.input_top_logprobs)
    return info
