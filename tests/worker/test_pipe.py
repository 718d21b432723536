"""The engine pipe's messages (worker/pipe.py): every message type round-trips exactly
(type and value), a frame that does not decode raises FrameError, a submission msgpack
cannot carry is InvalidArgument naming the field, and a burst crosses a real pipe."""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import fields
from typing import Any

import msgpack
import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.worker.config import EngineConfig
from radixmesh.worker.engine_info import EngineInfo
from radixmesh.worker.engine_process import _Outbox
from radixmesh.worker.kvcache.events import CacheEvent
from radixmesh.worker.pipe import (
    Abort,
    AbortAll,
    Call,
    Command,
    Drain,
    Error,
    Event,
    Failed,
    Fatal,
    FrameError,
    Out,
    Raise,
    Ready,
    Result,
    ResultMessage,
    Shutdown,
    Submit,
    decode_command,
    decode_results,
    encode_command,
    encode_results,
)
from radixmesh.worker.request_output import Finish, GrammarCounts, MetaInfo, RequestOutput
from radixmesh.worker.stats import SchedulerStats

RID = "9f2c4e1d0a7b4c3e8d6f5a4b3c2d1e0f"


def _meta(**kw: Any) -> MetaInfo:
    return MetaInfo(
        id=kw.pop("id", RID), prompt_tokens=7, completion_tokens=3, cached_tokens=4, **kw
    )


def _outputs() -> list[RequestOutput]:
    """Outputs as the engine makes them: mid-stream, with logprobs, finished each way."""
    lp = [(-0.123456789012345, 42, None), (-2.5e-08, 7, None)]
    top = [[(-0.1, 42, None), (-3.25, 9, None)], [(-1e-3, 7, None)]]
    final = dict(e2e_latency=1.25, queue_time=0.001, prefill_time=0.2, decode_time=1.049)
    return [
        RequestOutput(RID, [17], " Paris", False, _meta()),
        RequestOutput(RID, [42, 7], "é😀\udc80", False, _meta(num_retractions=2), lp, top),
        RequestOutput(
            RID,
            [5, 6, 7, 8],
            "abcd",
            False,
            _meta(spec_verify_steps=2, spec_drafted_tokens=8, spec_accepted_tokens=5),
        ),
        RequestOutput(
            RID,
            [2],
            "",
            True,
            _meta(
                finish=Finish("stop", 2),
                grammar=GrammarCounts(5, 2, 9),
                output_token_logprobs=lp,
                output_top_logprobs=top,
                input_token_logprobs=[(None, 1, None), (-4.0, 5, None)],
                input_top_logprobs=[[], [(-4.0, 5, None)]],
                **final,
            ),
            lp,
            top,
        ),
        RequestOutput(RID, [], "", True, _meta(finish=Finish("stop", "\n\n"), **final)),
        RequestOutput(RID, [9], "x", True, _meta(finish=Finish("length", None, 3), **final)),
        RequestOutput(
            RID,
            [],
            "",
            True,
            _meta(finish=Finish("abort", message="the grammar failed"), **final),
            error="the grammar failed",
        ),
        RequestOutput(
            RID,
            [],
            "",
            True,
            _meta(finish=Finish("length", None, 0)),
            embedding=[0.5, -1.0 / 3, 1e300],
        ),
        # ids that differ from the message's (they are carried, not assumed)
        RequestOutput("other", [1], "a", False, _meta(id="third")),
    ]


def _events() -> list[CacheEvent]:
    top = 2**64 - 1
    return [
        CacheEvent("stored", (1, 2, top), None, 48),
        CacheEvent("stored", (5,), top, 16),
        CacheEvent("removed", (5,), top, 16),
        CacheEvent("cleared", (), None, 0),
        CacheEvent("pending", (3, 4), 0, 32),
        CacheEvent("grammar_compiled", (), None, 0, grammar_keys=(7, top)),
        CacheEvent("grammar_evicted", (), None, 0, grammar_keys=(7,)),
    ]


def _info() -> EngineInfo:
    return EngineInfo(
        "smollm2",
        "smol",
        "HuggingFaceTB/SmolLM2-135M@abc",
        "{{x}}",
        2048,
        49152,
        frozenset({2, 0}),
        None,
        576,
    )


def _results() -> list[ResultMessage]:
    stats = SchedulerStats(*range(len(fields(SchedulerStats))))
    return [
        *(Out(RID if o.rid == "other" else o.rid, o) for o in _outputs()),
        *(Event(e) for e in _events()),
        Error(RID, ("INVALID_ARGUMENT", "max_new_tokens must be >= 0", "max_new_tokens")),
        Error(RID, ("INTERNAL", "RuntimeError: boom", None)),
        Result(0, True),
        Result(1, stats),
        Result(2, _events()),
        Raise(3, ("UNAVAILABLE", "the engine is down", None)),
        Fatal("the scheduler thread died: KeyError('x')"),
    ]


def _same(got: list[Any], want: list[Any]) -> None:
    """Equal, message by message and type by type (NamedTuples compare as tuples)."""
    assert [type(m) for m in got] == [type(m) for m in want]
    assert got == want


def test_every_result_round_trips_exactly_in_one_burst() -> None:
    msgs = _results()
    got = decode_results(encode_results(msgs))
    _same(got, msgs)
    outs = [m.output for m in got if isinstance(m, Out)]
    assert outs[-1].rid == "other" and outs[-1].meta_info.id == "third"
    # Containers keep their types (dataclass equality already tells a list from a tuple).
    assert type(outs[1].new_token_logprobs[0]) is tuple
    assert type(outs[3].meta_info.input_top_logprobs) is list
    spec = outs[2].meta_info
    assert (spec.spec_verify_steps, spec.spec_drafted_tokens, spec.spec_accepted_tokens) == (
        2,
        8,
        5,
    )
    events = [m.event for m in got if isinstance(m, Event)]
    assert all(type(e.block_hashes) is tuple for e in events)


def test_ready_and_failed_round_trip() -> None:
    config = EngineConfig.from_options(model="dummy:tiny", page_size=16)
    msgs: list[ResultMessage] = [Ready(config, _info())]
    _same(decode_results(encode_results(msgs)), msgs)
    failed: list[ResultMessage] = [Failed(("INVALID_ARGUMENT", "unknown engine option 'x'", "x"))]
    _same(decode_results(encode_results(failed)), failed)
    assert decode_results(encode_results([])) == []


def test_every_command_round_trips_exactly() -> None:
    params = {
        "max_new_tokens": 12,
        "temperature": 0.7,
        "stop": ["\n", "END"],
        "stop_token_ids": [2],
        "logit_bias": {5: -100.0, 49151: 2.5},
        "json_schema": '{"type": "object"}',
        "ignore_eos": True,
        "seed": 2**63,
    }
    msgs: list[Command] = [
        Submit(RID, [1, 2, 3], params, None),
        Submit("e", [4], {}, "mean"),
        Submit("w", [5, 6], {"max_new_tokens": 2}, None, "last"),
        Abort(RID),
        AbortAll("the worker is shutting down"),
        Drain(),
        Call(7, "get_stats", ()),
        Call(8, "some_call", (1, "two", [3.5])),
        Shutdown(),
    ]
    for msg in msgs:
        got = decode_command(encode_command(msg))
        assert type(got) is type(msg) and got == msg


def test_the_schema_names_every_field_it_carries() -> None:
    """A new field on one of these dataclasses needs its place in pipe.py's rows (else it
    would silently not cross the pipe): this list fails first."""
    assert [f.name for f in fields(RequestOutput)] == [
        "rid", "new_token_ids", "text_delta", "finished", "meta_info", "new_token_logprobs",
        "new_top_logprobs", "error", "embedding",
    ]  # fmt: skip
    assert [f.name for f in fields(MetaInfo)] == [
        "id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish", "e2e_latency",
        "queue_time", "prefill_time", "decode_time", "num_retractions", "grammar",
        "spec_verify_steps", "spec_drafted_tokens", "spec_accepted_tokens",
        "output_token_logprobs", "output_top_logprobs", "input_token_logprobs",
        "input_top_logprobs",
    ]  # fmt: skip
    assert [f.name for f in fields(Finish)] == ["reason", "matched", "length", "message"]
    assert [f.name for f in fields(GrammarCounts)] == [
        "forced_tokens",
        "jump_forwards",
        "decode_steps",
    ]
    assert [f.name for f in fields(CacheEvent)] == [
        "kind",
        "block_hashes",
        "parent_hash",
        "num_tokens",
        "request_id",  # (never crosses: the server publishes the request events itself)
        "grammar_keys",  # (in the blocks' place: a grammar event has none)
    ]


def test_a_truncated_frame_raises_frame_error() -> None:
    frame = encode_results(_results())
    for k in range(len(frame)):  # every proper prefix (a few KB: fast)
        with pytest.raises(FrameError, match="engine pipe"):
            decode_results(frame[:k])
    command = encode_command(Submit(RID, [1, 2, 3], {"max_new_tokens": 4}, None))
    for k in range(len(command)):
        with pytest.raises(FrameError, match="engine pipe"):
            decode_command(command[:k])


@pytest.mark.parametrize(
    "frame",
    [
        b"\xc1",  # a byte msgpack never uses
        b"\x93\x01\x02",  # an array of 3 with 2 items
        msgpack.packb([[0, 1]]) + b"\x00",  # trailing bytes
        msgpack.packb(5),  # not an array of messages
        msgpack.packb([[99, "x"]]),  # an unknown tag
        msgpack.packb([[0, RID, None, [1]]]),  # an Out row cut short
        msgpack.packb([[2, 99, [1], None, 16]]),  # an unknown event kind
        msgpack.packb([[2, -1, [1], None, 16]]),
        msgpack.packb([[3, 0, b"not a pickle"]]),  # a Result whose payload does not load
        msgpack.packb([5]),  # a message that is not an array
        b"\xff" * 16,
    ],
)
def test_a_garbled_result_frame_raises_frame_error(frame: bytes) -> None:
    with pytest.raises(FrameError, match="engine pipe"):
        decode_results(frame)


@pytest.mark.parametrize(
    "frame",
    [
        b"\xc1",
        msgpack.packb([9]),
        msgpack.packb([0, RID]),
        msgpack.packb([3, "x"]),
        msgpack.packb(5),
    ],
)
def test_a_garbled_command_frame_raises_frame_error(frame: bytes) -> None:
    with pytest.raises(FrameError, match="engine pipe"):
        decode_command(frame)


@pytest.mark.parametrize(
    ("submit", "field"),
    [
        (Submit(RID, [1, 2], {"temperature": object()}, None), "temperature"),
        (Submit(RID, [1, 2], {"seed": 2**70}, None), "seed"),
        (Submit(RID, [1, object()], {}, None), "input_ids"),  # type: ignore[list-item]
        (Submit(RID, [1], {}, object()), "pooling"),  # type: ignore[arg-type]
    ],
)
def test_a_submission_the_pipe_cannot_carry_names_the_field(submit: Submit, field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        encode_command(submit)
    assert e.value.field == field


def test_a_burst_crosses_a_real_pipe_through_the_outbox() -> None:
    """The child's sender (`_Outbox`) frames what it is given; a value that cannot be
    encoded (a call result that does not pickle) becomes Fatal, not a silent hang."""
    read, write = mp.Pipe(duplex=False)
    outbox = _Outbox(write)
    try:
        msgs = _results()
        for m in msgs:
            outbox.put(m)
        got: list[ResultMessage] = []
        while len(got) < len(msgs):  # the sender may split them into several bursts
            assert read.poll(10)
            got += decode_results(read.recv_bytes())
        _same(got, msgs)
        outbox.put(Result(9, lambda: None))  # a lambda does not pickle
        assert read.poll(10)
        (fatal,) = decode_results(read.recv_bytes())
        assert isinstance(fatal, Fatal)
        assert fatal.message.startswith("the engine sent a result it cannot encode")
    finally:
        outbox.close()
        read.close()
        write.close()
