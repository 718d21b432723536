"""The in-process backend: a `radixmesh.Engine` in this Python process.

`select` scores every choice with prompt logprobs: each choice is appended to the
context, tokenized as a whole (so a choice that merges with the context's last token is
scored as the model would see it), and the engine returns the logprobs from the first
token that differs from the context's own tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixmesh.errors import InvalidArgument, RadixMeshError
from radixmesh.lang.backend.base import Backend, Context, GenResult
from radixmesh.lang.chat_template import ChatTemplate
from radixmesh.lang.choices import TokenLogprob

if TYPE_CHECKING:
    from radixmesh.worker.engine import Engine

# The engine's prefill-only path (max_new_tokens=0) aborts today; one sampled token
# costs nothing extra (it comes out of the same forward pass) and is discarded.
_SCORE_TOKENS = 1


class EngineBackend(Backend):
    """`EngineBackend(engine)` wraps an engine; `EngineBackend(model=..., **options)` owns one."""

    def __init__(self, engine: Engine | None = None, model: str = "smollm2", **options: Any):
        if engine is None:
            from radixmesh.worker.engine import Engine

            engine = Engine(model, **options)
            self._owns = True
        else:
            self._owns = False
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.chat_template = ChatTemplate.from_tokenizer(engine.tokenizer)

    def generate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        out = self.engine.generate(ctx.text, params)
        if isinstance(out, list):  # n > 1
            for o in out:
                _check(o["meta_info"])
            return [o["text"] for o in out], {"choices": [o["meta_info"] for o in out]}
        assert isinstance(out, dict)
        return out["text"], _check(out["meta_info"])

    def generate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        if params.get("n", 1) != 1:
            raise InvalidArgument("n", "streaming generates one completion (n=1)")
        stream = self.engine.generate(ctx.text, params, stream=True)
        assert isinstance(stream, Iterator)
        for chunk in stream:
            yield chunk["text"], _check(chunk["meta_info"])

    def score(
        self, ctx: Context, choices: list[str], unconditional: bool
    ) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
        context_ids = self.tokenizer.encode(ctx.text)
        fulls = [self.tokenizer.encode(ctx.text + c) for c in choices]
        starts = [max(_common_prefix(context_ids, f), 1) for f in fulls]
        for choice, full, start in zip(choices, fulls, starts, strict=True):
            if start >= len(full):
                raise InvalidArgument("choices", f"choice {choice!r} adds no token to the text")
        cond = self._prompt_logprobs(fulls, starts)
        uncond = None
        if unconditional:
            uncond = self._prompt_logprobs(
                [f[s:] for f, s in zip(fulls, starts, strict=True)], [0] * len(fulls)
            )
        return cond, uncond

    def _prompt_logprobs(self, ids: list[list[int]], starts: list[int]) -> list[list[TokenLogprob]]:
        params = [
            {
                "max_new_tokens": _SCORE_TOKENS,
                "temperature": 0.0,
                "return_logprob": True,
                "logprob_start_len": s,
            }
            for s in starts
        ]
        outs = self.engine.generate(input_ids=ids, sampling_params=params)
        assert isinstance(outs, list)
        result = []
        for out, seq, start in zip(outs, ids, starts, strict=True):
            entries = _check(out["meta_info"])["input_token_logprobs"]
            if not entries and start == 0 and len(seq) == 1:
                # A one-token prompt has no prompt logprob; the engine then omits the
                # first token's (None) entry as well.
                entries = [(None, seq[0], None)]
            result.append([(lp, tid, self.tokenizer.decode([tid])) for lp, tid, _ in entries])
        return result

    def cache_prefix(self, text: str) -> None:
        if text:
            self.engine.generate(text, {"max_new_tokens": _SCORE_TOKENS, "temperature": 0.0})

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def shutdown(self) -> None:
        if self._owns:
            self.engine.shutdown()


def _check(meta: dict[str, Any]) -> dict[str, Any]:
    """Raise if the engine aborted the request (its message says why)."""
    reason = meta.get("finish_reason") or {}
    if reason.get("type") == "abort":
        raise RadixMeshError(f"the engine aborted the request: {reason.get('message', '')}")
    return meta


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
