"""What the in-process and cluster backends share: scoring `select`'s choices from prompt
logprobs, the requests that prefill or score, and the check of a finished request.

Each choice is appended to the context and tokenized as a whole (so a choice that merges
with the context's last token is scored as the model would see it); the model returns
the prompt logprobs from the first token that differs from the context's own tokens.
Backends differ only in how they run a list of such scoring requests
(`PromptLogprobs`): one batched engine call, or concurrent gRPC requests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from radixmesh.errors import InvalidArgument, RadixMeshError
from radixmesh.lang.choices import TokenLogprob
from radixmesh.prefix import common_prefix_len
from radixmesh.tokenizer import TokenizerLike

# The engine's prefill-only path (max_new_tokens=0) aborts today; one sampled token
# costs nothing extra (it comes out of the same forward pass) and is discarded.
SCORE_TOKENS = 1
PREFILL_PARAMS: dict[str, Any] = {"max_new_tokens": SCORE_TOKENS, "temperature": 0.0}

# (token ids, logprob start) per request -> (logprob, token id) entries per request
PromptLogprobs = Callable[[list[list[int]], list[int]], list[list[tuple[float | None, int]]]]
AsyncPromptLogprobs = Callable[
    [list[list[int]], list[int]], Awaitable[list[list[tuple[float | None, int]]]]
]


def score_params(logprob_start_len: int) -> dict[str, Any]:
    """Sampling parameters of one scoring request: prompt logprobs from the start on."""
    return {**PREFILL_PARAMS, "return_logprob": True, "logprob_start_len": logprob_start_len}


def score_choices(
    tokenizer: TokenizerLike,
    text: str,
    choices: list[str],
    unconditional: bool,
    prompt_logprobs: PromptLogprobs,
) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
    """Logprobs of each choice's tokens after `text` (and alone, if `unconditional`)."""
    fulls, starts = _plan(tokenizer, text, choices)
    cond = _scored(tokenizer, prompt_logprobs(fulls, starts), fulls, starts)
    if not unconditional:
        return cond, None
    tails = _tails(fulls, starts)
    return cond, _scored(
        tokenizer, prompt_logprobs(tails, [0] * len(tails)), tails, [0] * len(tails)
    )


async def ascore_choices(
    tokenizer: TokenizerLike,
    text: str,
    choices: list[str],
    unconditional: bool,
    prompt_logprobs: AsyncPromptLogprobs,
) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
    """`score_choices` with an asyncio runner of the scoring requests."""
    fulls, starts = _plan(tokenizer, text, choices)
    cond = _scored(tokenizer, await prompt_logprobs(fulls, starts), fulls, starts)
    if not unconditional:
        return cond, None
    tails = _tails(fulls, starts)
    zeros = [0] * len(tails)
    return cond, _scored(tokenizer, await prompt_logprobs(tails, zeros), tails, zeros)


def _plan(
    tokenizer: TokenizerLike, text: str, choices: list[str]
) -> tuple[list[list[int]], list[int]]:
    """Each choice's full token ids and where its own tokens start."""
    context_ids = tokenizer.encode(text)
    fulls = [tokenizer.encode(text + c) for c in choices]
    starts = [max(common_prefix_len(context_ids, f), 1) for f in fulls]
    for choice, full, start in zip(choices, fulls, starts, strict=True):
        if start >= len(full):
            raise InvalidArgument("choices", f"choice {choice!r} adds no token to the text")
    return fulls, starts


def _tails(fulls: list[list[int]], starts: list[int]) -> list[list[int]]:
    return [f[s:] for f, s in zip(fulls, starts, strict=True)]


def _scored(
    tokenizer: TokenizerLike,
    results: list[list[tuple[float | None, int]]],
    ids: list[list[int]],
    starts: list[int],
) -> list[list[TokenLogprob]]:
    scored = []
    for entries, seq, start in zip(results, ids, starts, strict=True):
        if not entries and start == 0 and len(seq) == 1:
            # A one-token prompt has no prompt logprob; the engine then omits the
            # first token's (None) entry as well.
            entries = [(None, seq[0])]
        scored.append([(lp, tid, tokenizer.decode([tid])) for lp, tid in entries])
    return scored


def check_finished(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta`, or raise if the engine aborted the request (its message says why)."""
    reason = meta.get("finish_reason") or {}
    if reason.get("type") == "abort":
        raise RadixMeshError(f"the engine aborted the request: {reason.get('message', '')}")
    return meta
