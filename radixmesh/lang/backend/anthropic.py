"""The Anthropic backend: the Messages API over the official `anthropic` client.

Roles map to messages (a leading system message becomes the `system` field) and text
already written into the assistant turn is sent as a prefill. The API returns no
logprobs and takes no constraints, so `select`, regex / json_schema, n > 1 and the
sampling knobs it lacks (in recent API versions: temperature, top_p, top_k too) fail
with a clear error.
"""

from __future__ import annotations

import inspect
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.lang.backend.base import Backend, Context, GenResult
from radixmesh.lang.chat_template import PLAIN
from radixmesh.lang.choices import TokenLogprob
from radixmesh.sampling_params import CONSTRAINT_KINDS

_MAPPED = {
    "max_new_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop": "stop_sequences",
}
# The API's own defaults: these values need not be sent.
_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
_NEUTRAL: dict[str, Any] = {
    "n": 1,
    "min_p": 0.0,
    "min_new_tokens": 0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "ignore_eos": False,
    "stop_token_ids": [],
    "return_logprob": False,
    "logprob_start_len": None,
    "top_logprobs_num": None,
    "seed": None,
}


class Anthropic(Backend):
    """`Anthropic(model_name, **client_kwargs)` (api_key=, base_url=, ...)."""

    is_chat_model = True

    def __init__(self, model_name: str, **client_kwargs: Any) -> None:
        import anthropic

        self.client = anthropic.Anthropic(**client_kwargs)
        self.model_name = model_name
        self.chat_template = PLAIN
        # Newer API versions dropped sampling fields (temperature, top_p, top_k): ask the
        # installed client what it takes rather than send what the server would refuse.
        self._accepted = set(inspect.signature(self.client.messages.create).parameters)

    def generate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        resp = self.client.messages.create(**self._request(ctx, params))
        text = "".join(block.text for block in resp.content if block.type == "text")
        usage = resp.usage
        return text, {
            "finish_reason": resp.stop_reason,
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "cached_tokens": getattr(usage, "cache_read_input_tokens", None) or 0,
        }

    def _request(self, ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
        for key in CONSTRAINT_KINDS:
            if params.get(key) is not None:
                raise InvalidArgument(
                    key, f"the Anthropic backend does not support {key} constraints"
                )
        for key, neutral in _NEUTRAL.items():
            value = params.get(key, neutral)
            if value not in (neutral, None, [], ()):
                raise InvalidArgument(
                    key, f"the Anthropic Messages API has no {key} ({key}={value!r})"
                )
        if ctx.role != "assistant":
            raise InvalidArgument(
                "gen",
                "with Anthropic, gen must be inside the assistant role: "
                "s += sgl.assistant(sgl.gen(...))",
            )
        request: dict[str, Any] = {"model": self.model_name}
        for key, field in _MAPPED.items():
            value = params.get(key)
            if value is None or value in ([], ()) or value == _DEFAULTS.get(key):
                continue
            if field not in self._accepted:
                raise InvalidArgument(
                    key, f"this version of the Anthropic Messages API takes no {field}"
                )
            request[field] = list(value) if key == "stop" else value
        messages = list(ctx.messages)
        if messages and messages[0]["role"] == "system":
            request["system"] = messages.pop(0)["content"]
        if ctx.role_text:  # text already in the assistant turn: Anthropic's prefill
            messages.append({"role": "assistant", "content": ctx.role_text})
        request["messages"] = messages
        return request

    def score(
        self, ctx: Context, choices: list[str], unconditional: bool
    ) -> tuple[list[list[TokenLogprob]], list[list[TokenLogprob]] | None]:
        raise InvalidArgument(
            "select", "the Anthropic Messages API returns no logprobs, so select cannot score"
        )
