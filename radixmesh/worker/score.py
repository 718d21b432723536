"""Scoring continuations: the requests that score them and their scores, shared by the
in-process engine and the engine process (no torch here: the server process imports it).

A continuation is scored by one request over prompt + continuation that generates one
token and returns the logprobs of the prompt from the prompt's end: the continuation's
tokens. The prompt's KV is shared through the radix cache.
"""

from __future__ import annotations

from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.worker.request_output import MetaInfo


def score_requests(
    input_ids: list[int], continuations: list[list[int]]
) -> tuple[list[list[int]], dict[str, Any]]:
    """The prompts (one per continuation) and the sampling parameters they share."""
    if not input_ids:
        raise InvalidArgument("input", "the prompt is empty")
    if not continuations:
        raise InvalidArgument("continuations", "no continuations to score")
    for i, cont in enumerate(continuations):
        if not cont:
            raise InvalidArgument(f"continuations[{i}]", "the continuation is empty")
    params = {
        "max_new_tokens": 1,
        "temperature": 0.0,
        "return_logprob": True,
        "logprob_start_len": len(input_ids),
    }
    return [input_ids + cont for cont in continuations], params


def score_of(meta: MetaInfo) -> list[float]:
    """A scoring request's result: the logprob of each continuation token (scored from
    the prompt's end, >= 1: every entry has its logprob)."""
    return [float(lp) for lp, _, _ in meta.input_token_logprobs or [] if lp is not None]
