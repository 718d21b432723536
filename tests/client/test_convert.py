"""Client <-> server conversions agree (radixmesh.wire, both directions): what the SDK
sends, the server reads back, and what the worker's engine produced reaches the SDK."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from radixmesh.client import convert
from radixmesh.errors import InvalidArgument, Overloaded, RequestAborted, Unavailable
from radixmesh.grpc_server import MAX_STATUS_BYTES, metadata_safe, status_message
from radixmesh.sampling_params import SamplingParams
from radixmesh.wire import params_from_proto
from radixmesh.worker.proto_out import chunk_to_proto
from radixmesh.worker.request_output import Finish, MetaInfo, RequestOutput


def _output(
    ids: list[int], text: str, finish: Finish | None, logprobs: list | None = None, **meta: Any
) -> RequestOutput:
    info = MetaInfo(
        id="r", prompt_tokens=5, completion_tokens=2, cached_tokens=4, finish=finish, **meta
    )
    return RequestOutput("r", ids, text, finish is not None, info, logprobs or [])


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"max_new_tokens": 7, "temperature": 0.0, "top_k": 1, "seed": 3},
        {"temperature": 0.7, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1},
        {"stop": ["\n", "."], "stop_token_ids": [2], "ignore_eos": True, "no_stop_trim": True},
        {"return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 0},
        {"skip_special_tokens": False, "min_new_tokens": 2, "frequency_penalty": -0.5},
        {"regex": "[0-9]+"},
        {"json_schema": '{"type": "object"}'},
        {"ebnf": 'root ::= "yes" | "no"'},
        {"choices": ["yes", "no"]},
        {"structural_tag": '{"type": "structural_tag", "format": {"type": "any_text"}}'},
        {"logit_bias": {"5": -100, 7: 2.5}},
        {"speculative": False},
    ],
)
def test_sampling_params_roundtrip(params: dict[str, object]) -> None:
    sent = convert.make_params(params)
    assert SamplingParams.from_dict(params_from_proto(sent)) == SamplingParams.from_dict(params)


@pytest.mark.parametrize(
    ("params", "on_wire", "read_back"),
    [({}, None, True), ({"speculative": True}, None, True), ({"speculative": False}, False, False)],
)
def test_speculative_is_sent_only_when_it_opts_out(
    params: dict[str, object], on_wire: bool | None, read_back: bool
) -> None:
    sent = convert.make_params(params)
    assert (sent.speculative if sent.HasField("speculative") else None) == on_wire
    fields = params_from_proto(sent)
    assert fields.get("speculative") == on_wire
    assert SamplingParams.from_dict(fields).speculative is read_back


def test_client_rejects_bad_params_before_sending() -> None:
    with pytest.raises(InvalidArgument) as e:
        convert.make_params({"top_p": 2.0})
    assert e.value.field == "top_p"
    with pytest.raises(InvalidArgument) as e:
        convert.make_params({"n": 2})
    assert e.value.field == "n"
    with pytest.raises(InvalidArgument) as e:
        convert.make_params({"speculative": "x"})
    assert (e.value.field, e.value.message) == ("speculative", "must be a bool, got 'x'")


def test_input_takes_exactly_one_kind() -> None:
    assert convert.make_input("hi", None, None).text == "hi"
    assert list(convert.make_input(None, None, [1, 2]).token_ids.ids) == [1, 2]
    msgs = convert.make_input(None, [{"role": "user", "content": "x"}], None).messages
    assert [(m.role, m.content) for m in msgs.messages] == [("user", "x")]
    with pytest.raises(InvalidArgument) as e:
        convert.make_input("hi", None, [1])
    assert e.value.field == "prompt"


def test_chunk_roundtrip_with_finish_and_logprobs() -> None:
    out = _output(
        [7, 8],
        " a.",
        Finish("stop", matched="."),
        [(-0.25, 7, None), (-1.0, 8, None)],
        input_token_logprobs=[(None, 11, None), (-0.5, 12, None)],
    )
    msg = chunk_to_proto("r1", out)
    got = convert.completion_from_proto(msg)
    assert (got.request_id, got.token_ids, got.text) == ("r1", [7, 8], " a.")
    assert (got.prompt_tokens, got.completion_tokens, got.cached_tokens) == (5, 2, 4)
    assert (got.finish_reason, got.matched_stop) == ("stop", ".")
    assert [(lp.token_id, lp.logprob) for lp in got.logprobs] == [(7, -0.25), (8, -1.0)]
    assert [(lp.token_id, lp.logprob) for lp in got.input_logprobs] == [(11, None), (12, -0.5)]


def _spec(c: Any) -> tuple[int, int, int]:
    return (c.spec_verify_steps, c.spec_drafted_tokens, c.spec_accepted_tokens)


def test_speculative_counters_reach_the_client() -> None:
    out = _output(
        [7, 8],
        "ab",
        Finish("length", length=2),
        spec_verify_steps=3,
        spec_drafted_tokens=11,
        spec_accepted_tokens=7,
    )
    msg = chunk_to_proto("r", out)
    assert _spec(msg) == (3, 11, 7)
    assert _spec(convert.chunk_from_proto(msg)) == (3, 11, 7)
    assert _spec(convert.completion_from_proto(msg)) == (3, 11, 7)
    plain = convert.chunk_from_proto(chunk_to_proto("r", _output([7], "a", None)))
    assert _spec(plain) == (0, 0, 0)
    joined = convert.join_chunks([plain, convert.chunk_from_proto(msg)])  # counts: the last's
    assert (joined.token_ids, _spec(joined)) == ([7, 7, 8], (3, 11, 7))


def test_matched_stop_token_id_and_abort_message() -> None:
    stop = chunk_to_proto("r", _output([2], "", Finish("stop", matched=2)))
    assert convert.chunk_from_proto(stop).matched_stop == 2
    reason = Finish("abort", message="aborted by the client")
    aborted = convert.chunk_from_proto(chunk_to_proto("r", _output([], "", reason)))
    assert (aborted.finish_reason, aborted.finish_message) == ("abort", "aborted by the client")


class _Rpc(grpc.RpcError):
    """A failed call as the client sees one: code, details, trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str, md: tuple[tuple[str, str], ...]):
        self._code, self._details, self._md = code, details, md

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md


def test_overload_and_size_limits_are_told_apart() -> None:
    full = _Rpc(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", (("radixmesh-retry-after", "2.5"),)
    )
    error = convert.error_from_rpc(full)
    assert isinstance(error, Overloaded) and error.retry_after == 2.5
    assert convert.is_overloaded(full)
    big = _Rpc(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (9 vs. 4)", ())
    error = convert.error_from_rpc(big)
    assert isinstance(error, InvalidArgument) and not convert.is_overloaded(big)
    assert (error.field, error.message) == (
        "request",
        "the message is too large: Received message larger than max (9 vs. 4)",
    )


def test_a_cancelled_this_process_did_not_ask_for_means_the_server_went_away() -> None:
    """grpc-core cancels a call that reached a server already shutting down; the call did
    nothing, so it is Unavailable (retried elsewhere). A call cancelled here is not."""
    dropped = _Rpc(grpc.StatusCode.CANCELLED, "CANCELLED", ())
    assert convert.server_went_away(dropped)
    error = convert.error_from_rpc(dropped)
    assert isinstance(error, Unavailable)
    assert (str(error), error.grpc_status) == (
        "the server dropped the call: CANCELLED",
        "UNAVAILABLE",
    )
    with grpc.insecure_channel("127.0.0.1:1") as channel:  # nothing listens there
        call = channel.unary_stream("/radixmesh.v1.Worker/Generate")(b"", wait_for_ready=True)
        call.cancel()
        with pytest.raises(grpc.RpcError) as local:
            next(call)
    assert local.value.code() == grpc.StatusCode.CANCELLED
    assert not convert.server_went_away(local.value)
    assert isinstance(convert.error_from_rpc(local.value), RequestAborted)
    assert convert.server_went_away(_Rpc(grpc.StatusCode.UNAVAILABLE, "down", ()))
    assert not convert.server_went_away(_Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "late", ()))


def test_status_messages_and_field_names_fit_in_a_trailer() -> None:
    assert status_message("short") == "short"
    cut = status_message("é" * 5000)
    assert len(cut.encode()) <= MAX_STATUS_BYTES + 10 and cut.endswith("... (cut)")
    assert status_message("\ud800 lone") == "? lone"
    assert metadata_safe("sampling_params.ключ\n") == "sampling_params.?????"
    assert metadata_safe("x" * 500) == "x" * 128 + "..."


def test_a_whole_request_carries_its_final_logprob_lists() -> None:
    final = [(-0.5, 3, None), (-0.25, 4, None)]
    out = _output([3, 4], "ab", Finish("length", length=2), output_token_logprobs=final)
    assert convert.completion_from_proto(chunk_to_proto("r", out)).logprobs == []
    whole = convert.completion_from_proto(chunk_to_proto("r", out, whole=True))
    assert [(lp.token_id, lp.logprob) for lp in whole.logprobs] == [(3, -0.5), (4, -0.25)]
    assert whole.finish_reason == "length"


def test_meta_info_to_dict_is_sglangs_shape() -> None:
    info = MetaInfo(
        id="r",
        prompt_tokens=3,
        completion_tokens=2,
        cached_tokens=1,
        finish=Finish("length", length=2),
        e2e_latency=0.5,
        queue_time=0.1,
        output_token_logprobs=[(-0.5, 3, None)],
    )
    assert info.to_dict() == {
        "id": "r",
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "cached_tokens": 1,
        "finish_reason": {"type": "length", "length": 2},
        "e2e_latency": 0.5,
        "queue_time": 0.1,
        "output_token_logprobs": [(-0.5, 3, None)],
    }
    assert list(info.to_dict())[:5] == [
        "id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason",
    ]  # fmt: skip


def test_meta_info_to_dict_has_sglangs_speculative_counters_only_after_a_verify_step() -> None:
    info = MetaInfo(
        id="r",
        prompt_tokens=3,
        completion_tokens=9,
        cached_tokens=0,
        spec_verify_steps=2,
        spec_drafted_tokens=8,
        spec_accepted_tokens=6,
    )
    assert info.to_dict() == {
        "id": "r",
        "prompt_tokens": 3,
        "completion_tokens": 9,
        "cached_tokens": 0,
        "finish_reason": None,
        "spec_verify_ct": 2,
        "spec_draft_tokens": 8,
        "spec_accepted_tokens": 6,
    }
    info.spec_verify_steps = info.spec_drafted_tokens = info.spec_accepted_tokens = 0
    assert "spec_verify_ct" not in info.to_dict()
