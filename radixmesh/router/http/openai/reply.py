"""Worker chunks -> OpenAI reply pieces: usage, finish reasons and logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from radixmesh.router.http.openai import responses as rs
from radixmesh.tokenizer import TokenizerLike
from radixmesh.v1 import common_pb2

_FINISH: dict[int, rs.FinishReason] = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}


def finish_reason(chunk: common_pb2.GenerateChunk) -> rs.FinishReason | None:
    return _FINISH.get(chunk.finish.reason) if chunk.HasField("finish") else None


@dataclass
class UsageCounter:
    """Token counts over a request's choices: each choice's completion tokens, each
    prompt's tokens once (its choices share the prompt, and the cache serves the copies)."""

    n: int  # choices per prompt
    prompt: dict[int, tuple[int, int]] = field(default_factory=dict)  # prompt -> (tokens, cached)
    completion: dict[int, int] = field(default_factory=dict)  # choice -> tokens so far

    def add(self, index: int, chunk: common_pb2.GenerateChunk) -> None:
        """Record a chunk of choice `index` (its counts are cumulative)."""
        self.completion[index] = chunk.completion_tokens
        prompt = index // self.n
        if prompt not in self.prompt or index % self.n == 0:
            self.prompt[prompt] = (chunk.prompt_tokens, chunk.cached_tokens)

    def usage(self) -> rs.Usage:
        prompt = sum(t for t, _ in self.prompt.values())
        completion = sum(self.completion.values())
        return rs.Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=rs.PromptTokensDetails(
                cached_tokens=sum(c for _, c in self.prompt.values())
            ),
        )


def choice_usage(chunk: common_pb2.GenerateChunk) -> rs.Usage:
    """One choice's usage so far (a chunk's counts are cumulative)."""
    return rs.Usage(
        prompt_tokens=chunk.prompt_tokens,
        completion_tokens=chunk.completion_tokens,
        total_tokens=chunk.prompt_tokens + chunk.completion_tokens,
        prompt_tokens_details=rs.PromptTokensDetails(cached_tokens=chunk.cached_tokens),
    )


def _lp(e: common_pb2.TokenLogprob) -> float | None:
    return e.logprob if e.HasField("logprob") else None


def chat_logprobs(chunk: common_pb2.GenerateChunk, tok: TokenizerLike) -> list[rs.TokenLogprob]:
    """The chunk's tokens in the chat layout (each with its top alternatives)."""

    def entry(tid: int, lp: float | None) -> rs.TopLogprob:
        text = token_text(tok, tid)
        return rs.TopLogprob(token=text, logprob=lp, bytes=list(text.encode()))

    tops: Sequence[common_pb2.TopLogprobs] = chunk.top_logprobs
    out = []
    for i, e in enumerate(chunk.logprobs):
        alts = tops[i].tokens if i < len(tops) else []
        chosen = entry(e.token_id, _lp(e))
        out.append(
            rs.TokenLogprob(
                **chosen.model_dump(), top_logprobs=[entry(a.token_id, _lp(a)) for a in alts]
            )
        )
    return out


def completion_logprobs(
    entries: Sequence[common_pb2.TokenLogprob],
    tops: Sequence[common_pb2.TopLogprobs],
    tok: TokenizerLike,
    offset: int,
) -> rs.CompletionLogprobs:
    """Tokens in the completions layout; `offset` is the text length before them."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        tokens.append(token_text(tok, e.token_id))
        offset += len(tokens[-1])
    return rs.CompletionLogprobs(
        tokens=tokens,
        token_logprobs=[_lp(e) for e in entries],
        top_logprobs=[{token_text(tok, a.token_id): _lp(a) for a in t.tokens} for t in tops],
        text_offset=offsets,
    )


def prompt_logprobs(chunk: common_pb2.GenerateChunk, tok: TokenizerLike) -> rs.CompletionLogprobs:
    """The prompt's logprobs (echo), from a last chunk; the first token has none."""
    lps = completion_logprobs(chunk.input_logprobs, chunk.input_top_logprobs, tok, 0)
    if lps.top_logprobs:
        lps.top_logprobs[0] = None
    return lps


def join_completion_logprobs(
    a: rs.CompletionLogprobs | None, b: rs.CompletionLogprobs
) -> rs.CompletionLogprobs:
    if a is None:
        return b
    return rs.CompletionLogprobs(
        tokens=a.tokens + b.tokens,
        token_logprobs=a.token_logprobs + b.token_logprobs,
        top_logprobs=a.top_logprobs + b.top_logprobs,
        text_offset=a.text_offset + b.text_offset,
    )


def token_text(tok: TokenizerLike, tid: int) -> str:
    return tok.decode([tid], skip_special_tokens=False)
