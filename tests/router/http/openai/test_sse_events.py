"""A streamed reply's events for plain text are built without pydantic models; they must be
exactly what the models dump, for completions and chat, with and without usage."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from radixmesh.router.http.openai.convert import Generation
from radixmesh.router.http.openai.generation import _ChunkEvents
from radixmesh.v1 import common_pb2

CHUNKS = [
    common_pb2.GenerateChunk(token_ids=[5], text="Hel", prompt_tokens=9, completion_tokens=1),
    common_pb2.GenerateChunk(token_ids=[6], text="", prompt_tokens=9, completion_tokens=2),
    common_pb2.GenerateChunk(
        token_ids=[7, 8], text='lo "w"\n', prompt_tokens=9, completion_tokens=4, cached_tokens=3
    ),
    common_pb2.GenerateChunk(
        token_ids=[2],
        text="",
        prompt_tokens=9,
        completion_tokens=5,
        cached_tokens=3,
        finish=common_pb2.Finish(reason=common_pb2.FINISH_REASON_STOP, matched_token_id=2),
    ),
]


def generation(chat: bool, include_usage: bool, continuous: bool) -> Generation:
    return Generation(
        chat=chat,
        model="m",
        prompts=[[1, 2, 3]],
        params=[common_pb2.SamplingParams()],
        n=1,
        stream=True,
        include_usage=include_usage,
        continuous_usage=continuous,
        top_logprobs=None,
        created=1_700_000_000,
    )


def events(gen: Generation, plain: bool) -> list[dict[str, Any]]:
    ev = _ChunkEvents(gen, "cmpl-1", tok=None)  # type: ignore[arg-type]  # no logprobs: unused
    assert ev.plain
    ev.plain = plain
    return [payload for chunk in CHUNKS for payload in ev.of(0, chunk)]


@pytest.mark.parametrize(
    ("chat", "include_usage", "continuous"), list(itertools.product([False, True], repeat=3))
)
def test_plain_events_are_the_models_dumps(
    chat: bool, include_usage: bool, continuous: bool
) -> None:
    gen = generation(chat, include_usage, continuous)
    fast, models = events(gen, plain=True), events(gen, plain=False)
    assert fast == models
    assert json.dumps(fast) == json.dumps(models)  # the same bytes: keys in the same order
    # Empty chunks go out only with continuous usage (they carry a token count).
    assert len(fast) == (4 if continuous else 3)
