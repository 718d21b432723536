"""The served model's identity and chat template name, for clients that infer from them.

ModelInfo's `model` is the name clients send (`smollm2`, or the worker's served name),
which says nothing of the weights. Clients read more into the model's name: SGLang's
RuntimeEndpoint picks its chat template by matching `/get_model_info`'s `model_path`
against name patterns (`sglang.lang.chat_template.get_chat_template_by_model_path`), and
vLLM-style clients read `/v1/models`' `root` for the model behind the name. So:

- `identity`: where the weights come from, derived from ModelInfo's `tokenizer` (the
  model spec the worker loaded): the bundled `smollm2` is SmolLM2-135M-Instruct, whose
  hub id is SMOLLM2_HUB_ID; a hub spec is its hub id; a directory or .gguf its path; a
  dummy model its spec. No proto field: the spec says it all.
- `template_name`: the chat template's family read from its Jinja text (ChatML's
  `<|im_start|>`, Llama 3's `<|start_header_id|>`), None when unknown or absent.
- `sglang_model_path`: the identity, plus a note that SGLang's name patterns read when
  the identity alone would not select the model's template. SGLang selects ChatML only for
  names containing "tinyllama" (its ChatML template is TinyLlama's), so a ChatML model
  SGLang knows no pattern for (SmolLM2) gets ` (chat template: chatml, as TinyLlama's)`;
  without it SGLang's client formats chats with its generic `USER:`/`ASSISTANT:` template,
  which the model was never trained on. Names SGLang already maps to a ChatML-style
  template of their own (Qwen, Yi, InternVL, ...) are left as they are, and so is
  `tokenizer_path` everywhere: a clean hub id a client can load a tokenizer from.
"""

from __future__ import annotations

import re

from radixmesh.model_source import DUMMY_PREFIX

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
    """`/get_model_info`'s model_path: the identity, with the note SGLang's template
    patterns need when they would not recognize it (see the module doc)."""
    if template == CHATML and not _SGLANG_CHATML_FAMILIES.search(model_identity):
        return f"{model_identity} (chat template: chatml, as TinyLlama's)"
    if template == LLAMA3 and not _SGLANG_LLAMA3.search(model_identity):
        return f"{model_identity} (chat template: llama-3-instruct)"
    return model_identity
