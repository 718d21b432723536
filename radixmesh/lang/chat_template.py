"""Role prefixes and suffixes, read off a tokenizer's own chat template.

The language writes roles as text (`s += sgl.user("hi")` appends the user prefix, "hi",
the user suffix), so it needs each role's surrounding strings. We render probe messages
through the tokenizer's template and cut the markers out, which works for ChatML,
Llama-3 and the simple fallback template alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant")
_MARK = {"system": "\x02S\x03", "user": "\x02U\x03", "assistant": "\x02A\x03"}


@dataclass(frozen=True)
class ChatTemplate:
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    # Inserted before the first non-system role when the template adds one itself.
    default_system_prompt: str | None = None

    def prefix(self, role: str) -> str:
        return self.role_prefix_and_suffix[role][0]

    def suffix(self, role: str) -> str:
        return self.role_prefix_and_suffix[role][1]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        render = tokenizer.apply_chat_template
        full = render(
            [{"role": r, "content": _MARK[r]} for r in ROLES], add_generation_prompt=False
        )
        s, u, a = (full.index(_MARK[r]) for r in ROLES)
        sys_prefix = full[:s]
        suffix = full[a + len(_MARK["assistant"]) :]
        between_su = full[s + len(_MARK["system"]) : u]
        between_ua = full[u + len(_MARK["user"]) : a]
        if not (between_su.startswith(suffix) and between_ua.startswith(suffix)):
            suffix = ""  # no common suffix: keep the whole separator in the prefixes
        user_prefix = between_su[len(suffix) :]
        asst_prefix = between_ua[len(suffix) :]
        default_system = None
        alone = render([{"role": "user", "content": _MARK["user"]}], add_generation_prompt=False)
        head = alone[: alone.index(_MARK["user"])]
        if head != user_prefix and head.startswith(sys_prefix) and head.endswith(user_prefix):
            body = head[len(sys_prefix) : len(head) - len(user_prefix)]
            default_system = body[: len(body) - len(suffix)] if suffix else body
        return cls(
            {
                "system": (sys_prefix, suffix),
                "user": (user_prefix, suffix),
                "assistant": (asst_prefix, suffix),
            },
            default_system,
        )


# For backends that speak messages, not text (OpenAI chat, Anthropic): roles leave no
# marks in the text, and messages() carries the structure.
PLAIN = ChatTemplate({r: ("", "") for r in ROLES}, None)


def _same(prefixes: dict[str, str], suffix: str) -> dict[str, tuple[str, str]]:
    return {r: (prefixes[r], suffix) for r in ROLES}


def _chatml(role: str) -> str:
    return f"<|im_start|>{role}\n"


def _llama3(role: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n"


# Templates by SGLang's names, for `RuntimeEndpoint(..., chat_template_name=...)` (by
# default the template comes from the model's own tokenizer instead).
NAMED: dict[str, ChatTemplate] = {
    "default": ChatTemplate(_same({r: f"{r.upper()}:" for r in ROLES}, "\n")),
    "chatml": ChatTemplate(_same({r: _chatml(r) for r in ROLES}, "<|im_end|>\n")),
    "qwen": ChatTemplate(
        _same({r: _chatml(r) for r in ROLES}, "<|im_end|>\n"), "You are a helpful assistant."
    ),
    "llama-3-instruct": ChatTemplate(_same({r: _llama3(r) for r in ROLES}, "<|eot_id|>")),
    "claude": ChatTemplate(
        {"system": ("", ""), "user": ("\n\nHuman: ", ""), "assistant": ("\n\nAssistant:", "")}
    ),
}


def named_template(name: str) -> ChatTemplate:
    if name not in NAMED:
        from radixmesh.errors import InvalidArgument

        raise InvalidArgument(
            "chat_template_name", f"unknown template {name!r}; known: {', '.join(sorted(NAMED))}"
        )
    return NAMED[name]
