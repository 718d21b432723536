"""SGLang's /generate as plain values (router/http/sglang_protocol.py), without a cluster:
the `speculative` sampling parameter in, and the draft counters in meta_info out."""

from __future__ import annotations

from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.sglang_protocol import GenerateRequest, OutputState, parse_generate
from radixmesh.tokenizer import ByteTokenizer
from radixmesh.v1 import common_pb2

TOK = ByteTokenizer(256, eos_token_ids=[0])


def parse(**params: Any) -> GenerateRequest:
    return parse_generate({"text": "hi", "sampling_params": params}, TOK, 64)


def test_speculative_is_sent_only_when_a_request_opts_out() -> None:
    off = parse(speculative=False).outputs[0].params
    assert (off.HasField("speculative"), off.speculative) == (True, False)
    assert parse(speculative=True).outputs[0].params.HasField("speculative") is False
    assert parse().outputs[0].params.HasField("speculative") is False


@pytest.mark.parametrize("bad", ["x", 1, [True]])
def test_a_speculative_that_is_not_a_bool_is_refused_by_name(bad: Any) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse(speculative=bad)
    assert (e.value.field, e.value.message) == (
        "sampling_params.speculative",
        f"must be a bool, got {bad!r}",
    )


def _meta(chunk: common_pb2.GenerateChunk) -> dict[str, Any]:
    state = OutputState(parse(), 0, "r1", TOK)
    state.add(chunk, "w1")
    return dict(state.to_json(0.5)["meta_info"])


def test_meta_info_carries_sglangs_draft_counters_only_where_a_step_verified() -> None:
    finish = common_pb2.Finish(reason=common_pb2.FINISH_REASON_LENGTH)
    chunk = common_pb2.GenerateChunk(
        token_ids=[104, 105], text="hi", prompt_tokens=2, completion_tokens=2, finish=finish
    )
    plain = {
        "id": "r1",
        "finish_reason": {"type": "length", "length": 2},
        "prompt_tokens": 2,
        "completion_tokens": 2,
        "cached_tokens": 0,
        "e2e_latency": 0.5,
        "worker_id": "w1",
    }
    assert _meta(chunk) == plain
    chunk.spec_verify_steps, chunk.spec_drafted_tokens, chunk.spec_accepted_tokens = 1, 3, 2
    assert _meta(chunk) == {
        **plain,
        "spec_verify_ct": 1,
        "spec_draft_tokens": 3,
        "spec_accepted_tokens": 2,
    }
