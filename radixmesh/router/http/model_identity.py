"""The served model's identity, its chat template's name, and its model objects.

ModelInfo's `model` is the name clients send (`smollm2`, or the worker's served name),
which says nothing of the weights. Clients read more into the model's name: vLLM-style
clients read `/v1/models`' `root` for the model behind the name, tools read SGLang's
`/get_model_info` `model_path` as a model id (to load its tokenizer, to label results),
and SGLang's RuntimeEndpoint picks its chat template by matching that same `model_path`
against name patterns (`sglang.lang.chat_template.get_chat_template_by_model_path`). So:

- `identity`: where the weights come from, derived from ModelInfo's `tokenizer` (the
  model spec the worker loaded): the bundled `smollm2` is SmolLM2-135M-Instruct, whose
  hub id is SMOLLM2_HUB_ID; a hub spec is its hub id; a directory or .gguf its path; a
  dummy model its spec. No proto field: the spec says it all.
- `template_name`: the chat template's family read from its Jinja text (ChatML's
  `<|im_start|>`, Llama 3's `<|start_header_id|>`), None when unknown or absent. It is
  `/get_model_info`'s own `chat_template` field; `model_path` is the identity alone.
- `sglang_model_path`: what SGLang's frontend alone is given as `model_path` (its
  requests are told apart by `is_sglang_frontend`). That client reads nothing but
  `model_path` to choose a template, and has no pattern for a ChatML model it does not
  know (SmolLM2): it would format chats with its generic `USER:` / `ASSISTANT:`
  template, which the model was never trained on. SGLang selects ChatML for names
  containing "tinyllama" (its ChatML template is TinyLlama's), so that client gets the
  identity with ` (chat template: chatml, as TinyLlama's)` after it; names SGLang already
  maps to a template of their own (Qwen, Yi, ...) are left as they are. Every other
  client gets the clean identity: the note would break a tool that loads the id.
- `openai_model`, `anthropic_model`: `/v1/models`' objects in each API's shape.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from radixmesh.model_source import DUMMY_PREFIX
from radixmesh.v1 import common_pb2

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
CHATML = "chatml"
LLAMA3 = "llama-3-instruct"
# Names SGLang's patterns map to a ChatML-style template of their own (or to ChatML).
_SGLANG_CHATML_FAMILIES = re.compile(r"tinyllama|qwen|yi-|llava|glm|intern|minicpm", re.I)
_SGLANG_LLAMA3 = re.compile(r"llama-3.*instruct", re.I)


def identity(spec: str) -> str:
    """Where the weights behind model spec `spec` come from (see the module doc)."""
    if spec == "smollm2":
        return SMOLLM2_HUB_ID
    if spec.startswith(DUMMY_PREFIX):
        return spec
    return spec.split("@", 1)[0] if "@" in spec and not spec.startswith("/") else spec


def template_name(chat_template: str) -> str | None:
    """The chat template's family, from its Jinja text; None when unknown or empty."""
    if "<|im_start|>" in chat_template and "<|im_end|>" in chat_template:
        return CHATML
    if "<|start_header_id|>" in chat_template:
        return LLAMA3
    return None


def sglang_model_path(model_identity: str, template: str | None) -> str:
    """The model_path SGLang's frontend is given: the identity, with the note its template
    patterns need when they would not recognize it (see the module doc)."""
    if template == CHATML and not _SGLANG_CHATML_FAMILIES.search(model_identity):
        return f"{model_identity} (chat template: chatml, as TinyLlama's)"
    if template == LLAMA3 and not _SGLANG_LLAMA3.search(model_identity):
        return f"{model_identity} (chat template: llama-3-instruct)"
    return model_identity


def is_sglang_frontend(headers: Mapping[str, str]) -> bool:
    """Whether a bodiless GET comes from SGLang's frontend (`sglang.utils.http_request`):
    urllib's User-Agent with a JSON Content-Type, which no browser, curl, `requests`,
    `httpx` or `aiohttp` client sends on a GET. Its RuntimeEndpoint has no other way to be
    told the template (it reads model_path only), and sends no header of its own."""
    agent = headers.get("User-Agent", "")
    kind = headers.get("Content-Type", "")
    return agent.startswith("Python-urllib/") and kind.startswith("application/json")


def openai_model(info: common_pb2.ModelInfo, created: int) -> dict[str, Any]:
    """OpenAI's model object, with vLLM's `root` (the weights) and `max_model_len`."""
    return {
        "id": info.model,
        "object": "model",
        "created": created,
        "owned_by": "radixmesh",
        "root": identity(info.tokenizer or info.model),
        "max_model_len": info.context_length,
    }


# Anthropic's `created_at` is the model's release, "an epoch value if the release date
# is unknown" (its Models API): the router knows no release date of the weights.
UNKNOWN_RELEASE = "1970-01-01T00:00:00Z"


def anthropic_model(info: common_pb2.ModelInfo) -> dict[str, Any]:
    """Anthropic's ModelInfo: `display_name` is the weights' identity; `max_tokens` the
    most a one-token prompt leaves."""
    return {
        "type": "model",
        "id": info.model,
        "display_name": identity(info.tokenizer or info.model),
        "created_at": UNKNOWN_RELEASE,
        "lifecycle": "active",
        "max_input_tokens": info.context_length,
        "max_tokens": max(info.context_length - 1, 1),
    }
