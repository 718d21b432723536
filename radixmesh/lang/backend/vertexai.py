"""The Vertex AI backend: Gemini models through Google's `vertexai` SDK.

Needs `pip install google-cloud-aiplatform` and the project in `GCP_PROJECT_ID` (region
in `GCP_LOCATION`), as SGLang's. Messages map to Vertex contents (system messages become
the model's system instruction); constraints and logprob-based `select` are not offered
by the API and fail with a clear error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.lang.backend.base import Backend, Context, GenResult
from radixmesh.lang.backend.openai import check_expressible
from radixmesh.lang.chat_template import PLAIN
from radixmesh.lang.errors import BackendUnavailable


class VertexAI(Backend):
    is_chat_model = True

    def __init__(self, model_name: str, safety_settings: Any = None) -> None:
        try:
            import vertexai
            from vertexai.generative_models import GenerationConfig, GenerativeModel
        except ImportError as e:
            raise BackendUnavailable(
                "the VertexAI backend needs `pip install google-cloud-aiplatform`"
            ) from e
        project = os.environ.get("GCP_PROJECT_ID")
        if not project:
            raise InvalidArgument("GCP_PROJECT_ID", "set it to the Google Cloud project to bill")
        vertexai.init(project=project, location=os.environ.get("GCP_LOCATION"))
        self._config_type = GenerationConfig
        self._model_type = GenerativeModel
        self.model_name = model_name
        self.safety_settings = safety_settings
        self.chat_template = PLAIN

    def _call(self, ctx: Context, params: dict[str, Any], stream: bool) -> Any:
        check_expressible(
            params, "Vertex AI", extra_neutral={"n": 1, "seed": None}, supported=("top_k",)
        )
        top_k = params.get("top_k", -1)
        config = self._config_type(
            candidate_count=1,
            max_output_tokens=params.get("max_new_tokens"),
            stop_sequences=list(params.get("stop") or []) or None,
            temperature=params.get("temperature"),
            top_p=params.get("top_p"),
            top_k=top_k if top_k and top_k > 0 else None,
        )
        system = [m["content"] for m in ctx.messages if m["role"] == "system"]
        contents = [
            {
                "role": "model" if m["role"] == "assistant" else "user",
                "parts": [{"text": m["content"]}],
            }
            for m in ctx.messages
            if m["role"] != "system"
        ] or ctx.text
        model = self._model_type(self.model_name, system_instruction=system or None)
        return model.generate_content(
            contents, generation_config=config, safety_settings=self.safety_settings, stream=stream
        )

    def generate(self, ctx: Context, params: dict[str, Any]) -> GenResult:
        return self._call(ctx, params, stream=False).text, {}

    def generate_stream(
        self, ctx: Context, params: dict[str, Any]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        for chunk in self._call(ctx, params, stream=True):
            yield chunk.text, {}
