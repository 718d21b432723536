"""OutputProcessor.append_forced: the same request state and emitted text as appending
the forced tokens one at a time, in every case that can end a request mid-way."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from radixmesh.sampling_params import SamplingParams
from radixmesh.tokenizer import ByteTokenizer
from radixmesh.worker.detokenizer import IncrementalDetokenizer
from radixmesh.worker.output import OutputProcessor
from radixmesh.worker.request import FinishReason, Request, RequestOutput
from radixmesh.worker.request_output import Delivery

TOK = ByteTokenizer(512, eos_token_ids=[2])
PROMPT = TOK.encode("Extract: ")
FORCED = TOK.encode('", "city": "')  # 12 tokens


def _request(stop_ids: frozenset[int] = frozenset(), **params: Any) -> Request:
    sp = SamplingParams(temperature=0.0, **params)
    req = Request(rid="r", prompt_ids=list(PROMPT), params=sp, stop_ids=stop_ids)
    req.detokenizer = IncrementalDetokenizer(TOK, PROMPT, stop=sp.stop)
    return req


def _run(bulk: bool, context_len: int = 4096, **kw: Any) -> tuple[Any, ...]:
    out = OutputProcessor(context_len)
    req = _request(**kw)
    got: list[RequestOutput] = []
    req.sink = got.append
    out.append_token(req, TOK.encode("A")[0], -0.5, None)  # a sampled token first
    if bulk:
        out.append_forced(req, FORCED)
    else:
        for t in FORCED:
            out.append_token(req, t, None, None)
            if req.finished:
                break
    out.emit(req)
    return (
        req.token_ids,
        req.finish_reason,
        req.matched_stop,
        [(o.new_token_ids, o.text_delta, o.finished) for o in got],
        req.output_token_logprobs,
    )


@pytest.mark.parametrize(
    "kw",
    [
        {},  # one push
        {"max_new_tokens": 13},  # ends exactly on the last forced token
        {"max_new_tokens": 5},  # ends inside the forced run
        {"stop": ["city"]},  # a stop string inside it
        {"stop_ids": frozenset({TOK.encode(":")[0]}), "max_new_tokens": 64},  # a stop token
        {"return_logprob": True},
        {"context_len": len(PROMPT) + 7},  # the context ends inside it
    ],
    ids=["plain", "len-at-end", "len-inside", "stop-str", "stop-tok", "logprobs", "context"],
)
def test_forced_run_equals_token_by_token(kw: dict[str, Any]) -> None:
    kw = dict(kw)
    context = kw.pop("context_len", 4096)
    assert _run(True, context, **kw) == _run(False, context, **kw)


def test_plain_run_is_one_push() -> None:
    tokens, reason, _, emitted, _ = _run(True)
    assert reason is None and tokens[len(PROMPT) :] == TOK.encode('A", "city": "')
    assert emitted == [(TOK.encode('A", "city": "'), 'A", "city": "', False)]


@pytest.mark.parametrize(
    ("delivery", "expected"),
    [
        (Delivery.STEPS, [("A", False), ("b", False), ("c", False), ("d", True)]),
        (Delivery.FIRST_AND_LAST, [("A", False), ("bcd", True)]),
        (Delivery.LAST, [("Abcd", True)]),
    ],
)
def test_delivery_names_the_outputs_a_request_gets(
    delivery: Delivery, expected: list[tuple[str, bool]]
) -> None:
    """Whatever the delivery, the outputs add up to the same tokens, text and logprobs."""
    out = OutputProcessor(4096)
    req = _request(max_new_tokens=4, return_logprob=True)
    req.delivery = delivery
    got: list[RequestOutput] = []
    req.sink = got.append
    for i, t in enumerate(TOK.encode("Abcd")):
        out.append_token(req, t, -0.25 * (i + 1), None)
        out.emit(req)
    assert [(o.text_delta, o.finished) for o in got] == expected
    assert [t for o in got for t in o.new_token_ids] == TOK.encode("Abcd")
    assert [lp for o in got for lp, _, _ in o.new_token_logprobs] == [-0.25, -0.5, -0.75, -1.0]
    assert got[-1].meta_info.completion_tokens == 4 and req.outputs_sent == len(expected)


class CountingTokenizer(ByteTokenizer):
    """ByteTokenizer that counts its decodes."""

    decodes = 0

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        self.decodes += 1
        return super().decode(ids, skip_special_tokens)


TEXT = "a é, 你好 🎉!"  # characters of 1 to 4 bytes, one token a byte: 18 tokens


def _outputs(
    delivery: Delivery, abort_after: int | None = None, grammar: bool = False, **params: Any
) -> tuple[list[tuple[list[int], str, bool]], int]:
    """Every output of a request that samples TEXT's bytes, one a step, until
    max_new_tokens, a stop or an abort after `abort_after` tokens; and the decodes."""
    tok = CountingTokenizer(512, eos_token_ids=[2])
    ids = tok.encode(TEXT)
    sp = SamplingParams(temperature=0.0, max_new_tokens=len(ids), **params)
    req = Request(
        rid="r", prompt_ids=list(PROMPT), params=sp, stop_ids=frozenset(sp.stop_token_ids)
    )
    req.detokenizer = IncrementalDetokenizer(
        tok, PROMPT, stop=sp.stop, no_stop_trim=sp.no_stop_trim
    )
    req.grammar = SimpleNamespace(counts=lambda: None) if grammar else None  # type: ignore[assignment]
    req.delivery = delivery
    got: list[RequestOutput] = []
    req.sink = got.append
    out = OutputProcessor(4096)
    for i, t in enumerate(ids):
        if i == abort_after:
            req.finish(FinishReason.ABORT)  # as Scheduler._finish_abort, between steps
            out.emit(req)
            break
        out.append_token(req, t, None, None)
        out.emit(req)
        if req.finished:
            break
    return [(o.new_token_ids, o.text_delta, o.finished) for o in got], tok.decodes


@pytest.mark.parametrize(
    ("params", "abort_after", "sampled", "text"),
    [
        ({}, None, TEXT, TEXT),
        ({"stop_token_ids": [ord(",")]}, None, "a é,", "a é"),
        ({"stop_token_ids": [ord(",")], "no_stop_trim": True}, None, "a é,", "a é,"),
        ({"stop": ["你"]}, None, "a é, 你", "a é, "),
        ({}, 4, "a é", "a é"),
        ({}, 3, "a \xc3", "a "),  # aborted inside é: its first byte is held back
    ],
    ids=["length", "stop-token", "stop-token-kept", "stop-string", "abort", "abort-mid-char"],
)
def test_every_delivery_sends_the_same_tokens_and_text(
    params: dict[str, Any], abort_after: int | None, sampled: str, text: str
) -> None:
    """LAST and the rest of FIRST_AND_LAST decode their tokens' text when the request
    ends, not a token at a time (`IncrementalDetokenizer.defer`): the same ids and text as
    a stream's outputs, all joined. (`sampled`: the tokens as latin-1 where not UTF-8.)"""
    ids = (
        list(sampled.encode("utf-8")) if "\xc3" not in sampled else list(sampled.encode("latin-1"))
    )
    for delivery in Delivery:
        outputs, _ = _outputs(delivery, abort_after, **params)
        joined = [t for o in outputs for t in o[0]], "".join(o[1] for o in outputs)
        assert joined == (ids, text), delivery
        assert outputs[-1][2] is True


def test_text_waits_for_the_end_only_where_no_output_reads_it() -> None:
    # A stream decodes the prompt's context once and each token at least twice (more
    # where it cuts a character: a look back); the 18 tokens here, 42 decodes.
    steps = _outputs(Delivery.STEPS)[1]
    assert steps == 42
    assert _outputs(Delivery.LAST)[1] == 1 + 2  # twice at the end
    assert _outputs(Delivery.FIRST_AND_LAST)[1] == 1 + 2 + 2  # the first at once
    # Stop strings and grammars read every token's text: no wait.
    assert _outputs(Delivery.LAST, stop=["zz"])[1] == steps
    assert _outputs(Delivery.LAST, grammar=True)[1] == steps
