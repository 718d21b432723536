"""The OpenAI backend: chat or text completions over the official `openai` client.

Works against OpenAI or any OpenAI-compatible endpoint (`base_url=`). What the API
cannot express fails with a clear error instead of being dropped: constraints
(regex, json_schema, gen_int / gen_string), sampling knobs the API lacks (top_k, min_p,
ignore_eos, ...). `select` needs prompt logprobs, which only the text completions API
returns (`echo=True`), so it works for completion models on endpoints that support that,
and fails with a clear error for chat models.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.lang.backend.base import Backend, Context, GenResult
from radixmesh.lang.chat_template import PLAIN, ChatTemplate
from radixmesh.lang.choices import TokenLogprob
from radixmesh.sampling_params import CONSTRAINT_KINDS

# engine name -> OpenAI request field
_MAPPED = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "n": "n",
    "seed": "seed",
}
# engine name -> its neutral value; anything else set is not expressible
_NEUTRAL: dict[str, Any] = {
    "top_k": -1,
    "min_p": 0.0,
    "min_new_tokens": 0,
    "ignore_eos": False,
    "stop_token_ids": [],
    "return_logprob": False,
    "logprob_start_len": None,
    "top_logprobs_num": None,
}


# Completion (not chat) models among OpenAI's, when is_chat_model is not given (SGLang's).
INSTRUCT_MODEL_NAMES = ("gpt-3.5-turbo-instruct",)


class OpenAI(Backend):
    """`OpenAI(model_name, base_url=..., api_key=...)`; extra arguments go to
    `openai.OpenAI` (`openai.AzureOpenAI` with `is_azure=True`)."""

    def __init__(
        self,
        model_name: str,
        is_chat_model: bool | None = None,
        chat_template: ChatTemplate | None = None,
        is_azure: bool = False,
        *client_args: Any,
        **client_kwargs: Any,
    ) -> None:
        import openai

        if not is_azure:
            client_kwargs.setdefault("api_key", os.environ.get("OPENAI_API_KEY", "EMPTY"))
        client_type = openai.AzureOpenAI if is_azure else openai.OpenAI
        self.client = client_type(*client_args, **client_kwargs)
        self.model_name = model_name
        if is_chat_model is None:
            is_chat_model = model_name not in INSTRUCT_MODEL_NAMES
        self.is_chat_model = is_chat_model
        self.chat_template = PLAIN if is_chat_model else (chat_template or PLAIN)

    # ---- generate -------------------------------------------------------------------

    def generate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        request = self._request(ctx, params)
        if self.is_chat_model:
            resp = self.client.chat.completions.create(**request)
            texts = [c.message.content or "" for c in sorted(resp.choices, key=_index)]
        else:
            resp = self.client.completions.create(**request)
            texts = [c.text for c in sorted(resp.choices, key=_index)]
        meta = _meta(resp.usage, resp.choices[0].finish_reason)
        return (texts if params.get("n", 1) > 1 else texts[0]), meta

    def generate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        request = self._request(ctx, params)
        api = self.client.chat.completions if self.is_chat_model else self.client.completions
        finish = None
        for chunk in api.create(**request, stream=True):
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            piece = (choice.delta.content if self.is_chat_model else choice.text) or ""
            finish = choice.finish_reason or finish
            yield piece, {"finish_reason": finish}

    def _request(self, ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
        check_expressible(params, "OpenAI")
        request: dict[str, Any] = {"model": self.model_name}
        for key, field in _MAPPED.items():
            if params.get(key) not in (None, [], ()):
                request[field] = list(params[key]) if key == "stop" else params[key]
        if self.is_chat_model:
            if ctx.role != "assistant" or ctx.role_text:
                raise InvalidArgument(
                    "gen",
                    "with an OpenAI chat model, gen must come right after the assistant "
                    "role begins: s += sgl.assistant(sgl.gen(...))",
                )
            request["messages"] = ctx.messages
        else:
            request["prompt"] = ctx.text
        return request

    # ---- select ---------------------------------------------------------------------

    def score(
        self, ctx: Context, choices: list[str], unconditional: bool
    ) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
        if self.is_chat_model:
            raise InvalidArgument(
                "select",
                "select needs the logprobs of the prompt's tokens, which the chat completions "
                "API does not return; use a completion model (is_chat_model=False) on an "
                "endpoint that supports echo with logprobs",
            )
        if not ctx.text:
            raise InvalidArgument("select", "select needs text before the choices")
        cond, segments = self._echo([ctx.text + c for c in choices], len(ctx.text))
        uncond = self._echo(segments, 0)[0] if unconditional else None
        return cond, uncond

    def _echo(self, prompts: list[str], start: int) -> tuple[list[list[TokenLogprob]], list[str]]:
        """Logprobs of each prompt's tokens that reach past `start`, and their text."""
        resp = self.client.completions.create(
            model=self.model_name, prompt=prompts, max_tokens=0, echo=True, logprobs=0
        )
        scored: list[list[TokenLogprob]] = []
        segments: list[str] = []
        for prompt, choice in zip(prompts, sorted(resp.choices, key=_index), strict=True):
            lp = choice.logprobs
            if lp is None or lp.token_logprobs is None or lp.text_offset is None:
                raise InvalidArgument(
                    "select", "the endpoint returned no prompt logprobs (echo with logprobs)"
                )
            tokens = lp.tokens or []
            first = next(
                i
                for i, (off, tok) in enumerate(zip(lp.text_offset, tokens, strict=True))
                if off + len(tok) > start or i == len(tokens) - 1
            )
            scored.append(
                [(lp.token_logprobs[i], tokens[i], tokens[i]) for i in range(first, len(tokens))]
            )
            segments.append(prompt[lp.text_offset[first] :])
        return scored, segments


def check_expressible(
    params: dict[str, Any],
    api: str,
    extra_neutral: dict[str, Any] | None = None,
    supported: tuple[str, ...] = (),
) -> None:
    """Raise for what an OpenAI-like API cannot express: constraints, and sampling knobs
    set to anything but their neutral value (`supported` ones excepted)."""
    for key in CONSTRAINT_KINDS:
        if params.get(key) is not None:
            raise InvalidArgument(key, f"the {api} backend does not support {key} constraints")
    for key, neutral in {**_NEUTRAL, "stop_regex": None, **(extra_neutral or {})}.items():
        value = params.get(key, neutral)
        if key not in supported and value not in (neutral, None, [], ()):
            raise InvalidArgument(key, f"the {api} API has no {key} ({key}={value!r})")


def _index(choice: Any) -> int:
    return int(choice.index)


def _meta(usage: Any, finish_reason: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"finish_reason": finish_reason}
    if usage is not None:
        meta["prompt_tokens"] = usage.prompt_tokens
        meta["completion_tokens"] = usage.completion_tokens
        details = getattr(usage, "prompt_tokens_details", None)
        meta["cached_tokens"] = getattr(details, "cached_tokens", None) or 0
    return meta
