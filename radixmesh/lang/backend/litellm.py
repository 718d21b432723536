"""The LiteLLM backend: any provider LiteLLM routes to, through `litellm.completion`.

Chat-shaped like the OpenAI chat backend: the program's messages are sent (its text as
one user message when it has no roles). What LiteLLM's common parameters cannot express
(constraints, top_k, min_p, ...) fails with a clear error, as in the OpenAI backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.lang.backend.base import Backend, Context, GenResult
from radixmesh.lang.backend.openai import check_expressible
from radixmesh.lang.chat_template import PLAIN, ChatTemplate
from radixmesh.lang.errors import BackendUnavailable

_MAPPED = {
    "max_new_tokens": "max_tokens",
    "stop": "stop",
    "temperature": "temperature",
    "top_p": "top_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
}


class LiteLLM(Backend):
    is_chat_model = True

    def __init__(
        self,
        model_name: str,
        chat_template: ChatTemplate | None = None,
        api_key: str | None = None,
        organization: str | None = None,
        base_url: str | None = None,
        timeout: float | None = 600,
        max_retries: int | None = None,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        try:
            import litellm
        except ImportError as e:
            raise BackendUnavailable("the LiteLLM backend needs `pip install litellm`") from e
        self._litellm = litellm
        self.model_name = model_name
        self.chat_template = chat_template or PLAIN
        self.client_params: dict[str, Any] = {
            "api_key": api_key,
            "organization": organization,
            "base_url": base_url,
            "timeout": timeout,
            "max_retries": litellm.num_retries if max_retries is None else max_retries,
            "default_headers": default_headers,
        }

    def _request(self, ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
        check_expressible(params, "LiteLLM", extra_neutral={"n": 1, "seed": None})
        request: dict[str, Any] = {"model": self.model_name, **self.client_params}
        for key, field in _MAPPED.items():
            if params.get(key) not in (None, [], ()):
                request[field] = list(params[key]) if key == "stop" else params[key]
        request["messages"] = ctx.messages or [{"role": "user", "content": ctx.text}]
        if ctx.role == "assistant" and ctx.role_text:
            raise InvalidArgument(
                "gen", "with LiteLLM, gen must come right after the assistant role begins"
            )
        return request

    def generate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        resp = self._litellm.completion(**self._request(ctx, params))
        usage = getattr(resp, "usage", None)
        meta: dict[str, Any] = {"finish_reason": resp.choices[0].finish_reason}
        if usage is not None:
            meta["prompt_tokens"] = usage.prompt_tokens
            meta["completion_tokens"] = usage.completion_tokens
        return resp.choices[0].message.content or "", meta

    def generate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        for chunk in self._litellm.completion(**self._request(ctx, params), stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                yield chunk.choices[0].delta.content, {}
