"""Crusoe's managed inference: an OpenAI-compatible API, so the OpenAI backend with
Crusoe's address and key (`CRUSOE_API_KEY`) as defaults."""

from __future__ import annotations

import os
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.lang.backend.openai import OpenAI
from radixmesh.lang.chat_template import ChatTemplate

CRUSOE_BASE_URL = "https://managed-inference-api-proxy.crusoecloud.com/v1/"


class Crusoe(OpenAI):
    def __init__(
        self,
        model_name: str,
        api_key: str | None = None,
        base_url: str | None = None,
        chat_template: ChatTemplate | None = None,
        **kwargs: Any,
    ) -> None:
        key = api_key or os.environ.get("CRUSOE_API_KEY")
        if not key:
            raise InvalidArgument(
                "api_key", "a Crusoe API key is needed: api_key= or CRUSOE_API_KEY"
            )
        super().__init__(
            model_name,
            chat_template=chat_template,
            api_key=key,
            base_url=base_url or CRUSOE_BASE_URL,
            **kwargs,
        )
