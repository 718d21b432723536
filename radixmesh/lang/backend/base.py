"""The backend interface: what the interpreter asks of a model provider.

A backend turns a program state's context (its text, or its messages for chat APIs)
into generations and choice scores. Calls may come from many executor threads at once;
implementations must be thread-safe.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from radixmesh.lang.chat_template import ChatTemplate
from radixmesh.lang.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    TokenLogprob,
    normalized_logprob,
)


@dataclass(frozen=True)
class Context:
    """What a backend sees of a program state at a model call."""

    text: str
    messages: list[dict[str, str]]
    role: str | None  # the role being written, None outside roles
    role_text: str  # text written since that role began


GenResult = tuple[str | list[str], dict[str, Any]]


class Backend(ABC):
    """A model provider. `params` use the engine's sampling-parameter names."""

    chat_template: ChatTemplate
    # Speaks messages, not text: a gen must start an assistant turn (see speculative.py).
    is_chat_model = False

    @abstractmethod
    def generate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        """Text (a list when n > 1) and its meta_info."""

    def generate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Text deltas with meta_info; the default streams the whole result as one delta."""
        text, meta = self.generate(ctx, params)
        yield (text if isinstance(text, str) else text[0]), meta

    def score(
        self, ctx: Context, choices: list[str], unconditional: bool
    ) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
        """Logprobs of each choice's tokens after the context (and alone, if asked)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot score choices, so select is not supported"
        )

    def select(
        self,
        ctx: Context,
        choices: list[str],
        temperature: float,
        method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        cond, uncond = self.score(ctx, choices, method.requires_unconditional_logprobs)
        return method(
            choices=choices,
            normalized_prompt_logprobs=[normalized_logprob(c) for c in cond],
            input_token_logprobs=cond,
            output_token_logprobs=[[] for _ in choices],
            unconditional_token_logprobs=uncond,
        )

    def cache_prefix(self, text: str) -> None:  # noqa: B027 - optional hook
        """Prefill `text` so later requests that start with it hit the cache."""

    def flush_cache(self) -> bool:
        return False

    def get_server_info(self) -> dict[str, Any]:
        """What serves the backend's requests (SGLang's server info, where there is one)."""
        return {"backend": type(self).__name__}

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend owns."""
