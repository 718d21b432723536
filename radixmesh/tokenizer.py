"""Tokenizers and chat templates, shared by the worker and the router.

Two implementations satisfy one protocol, `TokenizerLike`:

- `Tokenizer` wraps a Hugging Face fast tokenizer (from a model directory or a GGUF file);
- `ByteTokenizer` needs no files: ids 0..255 are UTF-8 bytes, so `dummy:<preset>` models of
  any vocabulary size can run end to end.

The router tokenizes each prompt once (chat template included) and the worker trusts those
ids, so both must build the tokenizer the same way: through `tokenizer_for(spec, ...)`,
from the files `radixmesh.model_source` resolves and what the model's architecture says
about its vocabulary (the worker reads it from the model; the router from the worker's
ModelInfo, so the router imports no worker code). In process,
`radixmesh.worker.model.loader.load_tokenizer(spec)` reads the architecture itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from radixmesh.errors import InvalidArgument
from radixmesh.model_source import cached_dir, resolve_model

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ROLES = ("system", "user", "assistant")

Message = dict[str, str]
# A message of a tool conversation, as Hugging Face chat templates take it: `tool_calls`
# on assistant messages (arguments as dicts), `tool` messages with `tool_call_id`.
ToolMessage = dict[str, Any]


@runtime_checkable
class TokenizerLike(Protocol):
    """What the engine, the router and the language backends need from a tokenizer.

    `vocab_size` is the model's (its embedding rows), which may exceed the number of tokens
    the tokenizer knows; ids past the tokenizer's own vocabulary decode to "".
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def has_chat_template(self) -> bool: ...

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders tools itself (`encode_tool_chat`)."""
        ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]: ...

    def apply_chat_template(
        self,
        messages: list[Message],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The chat as the model's template renders it; `template_kwargs` are extra
        variables of the template (a request's `chat_template_kwargs`, e.g. Qwen3's
        `enable_thinking`), checked by `check_template_kwargs`."""
        ...

    def encode_chat(
        self,
        messages: list[Message],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]: ...

    def encode_tool_chat(
        self,
        messages: list[ToolMessage],
        tools: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """A tool conversation through the template's own tool section (the caller
        validated the messages; `tools` are OpenAI's `{"type": "function", ...}`)."""
        ...


def validate_messages(messages: object) -> list[Message]:
    """Check a chat message list; raise InvalidArgument("messages", ...) naming the problem."""
    if not isinstance(messages, list):
        raise InvalidArgument(
            "messages", f"must be a list of messages, got {type(messages).__name__}"
        )
    if not messages:
        raise InvalidArgument("messages", "must not be empty")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidArgument("messages", f"item {i} must be a dict, got {type(msg).__name__}")
        for key in ("role", "content"):
            if not isinstance(msg.get(key), str):
                raise InvalidArgument("messages", f"item {i} needs a string {key!r}")
        if msg["role"] not in ROLES:
            raise InvalidArgument(
                "messages", f"item {i} has unknown role {msg['role']!r}; expected one of {ROLES}"
            )
    return messages


# A request's field for extra chat-template variables (vLLM's and SGLang's name).
TEMPLATE_KWARGS_FIELD = "chat_template_kwargs"
MAX_TEMPLATE_KWARGS = 32
# Names the template call itself takes (transformers' apply_chat_template parameters, and
# the variables it sets): as template variables they would change the call, not the text.
RESERVED_TEMPLATE_NAMES = frozenset(
    {
        "messages", "conversation", "tools", "documents", "chat_template",
        "add_generation_prompt", "continue_final_message", "tokenize", "padding",
        "truncation", "max_length", "return_tensors", "return_dict",
        "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs",
    }
)  # fmt: skip


def check_template_kwargs(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """A request's extra chat-template variables as keyword arguments: at most
    MAX_TEMPLATE_KWARGS, each named by an identifier that is none of the template call's
    own names; InvalidArgument naming `chat_template_kwargs` otherwise."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise InvalidArgument(
            TEMPLATE_KWARGS_FIELD, f"must be an object, got {type(kwargs).__name__}"
        )
    if len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise InvalidArgument(
            TEMPLATE_KWARGS_FIELD, f"at most {MAX_TEMPLATE_KWARGS} variables, got {len(kwargs)}"
        )
    for name in kwargs:
        if not (isinstance(name, str) and name.isidentifier()):
            raise InvalidArgument(TEMPLATE_KWARGS_FIELD, f"{name!r} is not a variable name")
        if name in RESERVED_TEMPLATE_NAMES:
            raise InvalidArgument(
                TEMPLATE_KWARGS_FIELD, f"{name!r} is the template call's own; use the request's"
            )
    return dict(kwargs)


def simple_chat_template(messages: list[Message], add_generation_prompt: bool = True) -> str:
    """The template of models that ship none: "<|role|>\\ncontent\\n" per message."""
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return text + ("<|assistant|>\n" if add_generation_prompt else "")


class Tokenizer:
    """A Hugging Face fast tokenizer behind the `TokenizerLike` interface.

    `eos_token_ids` joins the tokenizer's eos with the model config's (chat models often
    stop on several ids, e.g. Llama 3's <|eot_id|> and <|end_of_text|>).
    """

    def __init__(
        self,
        hf_tokenizer: PreTrainedTokenizerBase,
        *,
        vocab_size: int | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        self.hf_tokenizer = hf_tokenizer
        self._vocab_size = vocab_size if vocab_size is not None else len(hf_tokenizer)
        eos = set(eos_token_ids)
        if hf_tokenizer.eos_token_id is not None:
            eos.add(int(hf_tokenizer.eos_token_id))
        self._eos_token_ids = frozenset(eos)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        gguf_file: str | None = None,
        vocab_size: int | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> Tokenizer:
        """From a directory with tokenizer files, or a GGUF file (`gguf_file`) inside `path`."""
        from transformers import AutoTokenizer  # lazy: transformers takes seconds to import

        hf = AutoTokenizer.from_pretrained(path, gguf_file=gguf_file)
        return cls(hf, vocab_size=vocab_size, eos_token_ids=eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        bos = self.hf_tokenizer.bos_token_id
        return None if bos is None else int(bos)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.hf_tokenizer.chat_template)

    def set_chat_template(self, template: str, source: str = "chat_template") -> None:
        """Replace the model's chat template (a Jinja string); a template that does not
        render one user message is an InvalidArgument naming `source`."""
        previous = self.hf_tokenizer.chat_template
        self.hf_tokenizer.chat_template = template
        try:
            self.apply_chat_template([{"role": "user", "content": "hi"}])
        except Exception as e:
            self.hf_tokenizer.chat_template = previous
            raise InvalidArgument("chat_template", f"{source}: {type(e).__name__}: {e}") from e

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.hf_tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # No clean-up of spaces: streamed (windowed) decoding must equal a full decode.
        text = self.hf_tokenizer.decode(
            list(ids),
            skip_special_tokens=skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        assert isinstance(text, str)
        return text

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        """Token strings (byte-level BPE shows a space as "Ġ"); None past the vocabulary."""
        tokens = self.hf_tokenizer.convert_ids_to_tokens(list(ids))
        return list(tokens) if isinstance(tokens, list) else [tokens]

    def apply_chat_template(
        self,
        messages: list[Message],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The model's own template; `simple_chat_template` for models that ship none
        (which has no variables: `template_kwargs` change nothing there)."""
        validate_messages(messages)
        extra = check_template_kwargs(template_kwargs)  # checked alike with no template
        if not self.has_chat_template:
            return simple_chat_template(messages, add_generation_prompt)
        try:
            text = self.hf_tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
            )
        except Exception as e:
            if not extra:
                raise
            # Rendered again without them: if that fails too, the messages are what the
            # template refuses, and it says so as it did before.
            self.apply_chat_template(messages, add_generation_prompt)
            raise InvalidArgument(
                TEMPLATE_KWARGS_FIELD, f"the chat template failed with them: {e}"
            ) from e
        assert isinstance(text, str)
        return text

    def encode_chat(
        self,
        messages: list[Message],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        # The template already writes BOS where the model wants one; adding special tokens
        # again would give Llama-style models a double BOS.
        return self.encode(
            self.apply_chat_template(messages, add_generation_prompt, template_kwargs)
        )

    @property
    def supports_tools(self) -> bool:
        template = self.hf_tokenizer.chat_template
        return isinstance(template, str) and "tools" in template

    def encode_tool_chat(
        self,
        messages: list[ToolMessage],
        tools: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        if not self.supports_tools:
            raise InvalidArgument("tools", "this model's chat template has no tool section")
        extra = check_template_kwargs(template_kwargs)
        try:
            text = self.hf_tokenizer.apply_chat_template(
                messages,
                tools=cast("list[Any]", tools),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **extra,
            )
        except Exception as e:  # the template's own checks (jinja2's raise_exception)
            raise InvalidArgument("messages", f"the chat template refused them: {e}") from e
        assert isinstance(text, str)
        return self.encode(text)


class ByteTokenizer:
    """Bytes as tokens, for `dummy:` models that ship no tokenizer.

    Ids 0..255 are the bytes of the UTF-8 text; decoding joins them with errors="replace".
    Ids from 256 to `vocab_size` - 1 exist only so random models of real shapes can sample
    them: they decode to "" and `convert_ids_to_tokens` names them "<|id_N|>". An eos or bos
    id below 256 doubles as that byte.
    """

    def __init__(
        self, vocab_size: int, *, eos_token_ids: Iterable[int] = (), bos_token_id: int | None = None
    ) -> None:
        if vocab_size < 256:
            raise InvalidArgument("vocab_size", f"a byte tokenizer needs >= 256, got {vocab_size}")
        self._vocab_size = vocab_size
        self._eos_token_ids = frozenset(eos_token_ids)
        self._bos_token_id = bos_token_id
        self._special = self._eos_token_ids | ({bos_token_id} - {None})

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def has_chat_template(self) -> bool:
        return True

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        if add_special_tokens and self._bos_token_id is not None:
            ids.insert(0, self._bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        skip = self._special if skip_special_tokens else frozenset()
        data = bytes(i for i in ids if 0 <= i < 256 and i not in skip)
        return data.decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        return [self._token_name(i) for i in ids]

    def _token_name(self, i: int) -> str | None:
        if not 0 <= i < self._vocab_size:
            return None
        if i >= 256:
            return f"<|id_{i}|>"
        # Printable ASCII as itself, other bytes in SentencePiece's byte-fallback spelling.
        return chr(i) if 0x21 <= i <= 0x7E else f"<0x{i:02X}>"

    def apply_chat_template(
        self,
        messages: list[Message],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        check_template_kwargs(template_kwargs)  # checked alike; the simple template has none
        return simple_chat_template(validate_messages(messages), add_generation_prompt)

    def encode_chat(
        self,
        messages: list[Message],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        return self.encode(
            self.apply_chat_template(messages, add_generation_prompt, template_kwargs)
        )

    @property
    def supports_tools(self) -> bool:
        return False

    def encode_tool_chat(
        self,
        messages: list[ToolMessage],
        tools: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        raise InvalidArgument("tools", "the byte tokenizer's chat template has no tool section")


def tokenizer_for(
    spec: str,
    *,
    vocab_size: int,
    eos_token_ids: Iterable[int],
    bos_token_id: int | None,
    download_dir: str | None = None,
    chat_template: str | None = None,
) -> Tokenizer | ByteTokenizer:
    """The tokenizer of a model spec ("smollm2", an HF directory, a .gguf path, a hub id,
    dummy:<preset>), given the model's vocabulary size and eos / bos ids, with
    `chat_template` (a Jinja string) replacing the model's own when given.

    A GGUF's tokenizer is read from the worker's converted cache when there is one (a
    fraction of a second) and else built from the GGUF's metadata: a router that only
    tokenizes should not pay for (or store) a weight conversion. Of a hub model only the
    tokenizer files are fetched (`download_dir`: the hub cache to use).
    """
    tok = _tokenizer_for(spec, vocab_size, tuple(eos_token_ids), bos_token_id, download_dir)
    if chat_template:
        if not isinstance(tok, Tokenizer):
            raise InvalidArgument("chat_template", "dummy models use the built-in template")
        tok.set_chat_template(chat_template)
    return tok


def _tokenizer_for(
    spec: str,
    vocab_size: int,
    eos: tuple[int, ...],
    bos_token_id: int | None,
    download_dir: str | None,
) -> Tokenizer | ByteTokenizer:
    src = resolve_model(spec, download_dir=download_dir, weights=False)
    if src.kind == "dummy":
        return ByteTokenizer(vocab_size, eos_token_ids=eos, bos_token_id=bos_token_id)
    assert src.path is not None, src
    if src.kind == "hf":
        return Tokenizer.from_pretrained(src.path, vocab_size=vocab_size, eos_token_ids=eos)
    converted = cached_dir(src.path)
    if converted is not None:
        return Tokenizer.from_pretrained(str(converted), vocab_size=vocab_size, eos_token_ids=eos)
    path = Path(src.path)
    return Tokenizer.from_pretrained(
        str(path.parent), gguf_file=path.name, vocab_size=vocab_size, eos_token_ids=eos
    )
