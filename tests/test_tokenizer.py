"""The shared tokenizer: HF-backed `Tokenizer`, `ByteTokenizer`, chat templates."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from radixmesh.errors import InvalidArgument
from radixmesh.tokenizer import ByteTokenizer, Tokenizer, TokenizerLike
from radixmesh.worker.model.loader import load_tokenizer

TEXT = "Hello, world! Prefixes — ünïcödé 你好 🙂\n\tdone."
CHAT = [
    {"role": "user", "content": "What is a radix tree?"},
    {"role": "assistant", "content": "A compressed trie."},
]
BAD_MESSAGES: list[Any] = [
    "hello",
    [],
    ["hello"],
    [{"role": "user"}],
    [{"content": "hi"}],
    [{"role": "wizard", "content": "hi"}],
    [{"role": "user", "content": 3}],
]


def _bos_adding_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer whose post-processor prepends <s>, like Llama's."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {c: i + 3 for i, c in enumerate(alphabet)}
    rust = RustTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    rust.add_special_tokens(["<unk>", "<s>", "</s>"])
    rust.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=rust, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    hf.chat_template = chat_template
    return hf


LLAMA_STYLE_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture(scope="module")
def smollm2(smollm2_tokenizer: PreTrainedTokenizerBase) -> Tokenizer:
    return Tokenizer(smollm2_tokenizer, vocab_size=49152, eos_token_ids=(2,))


# --- Tokenizer over the real smollm2 tokenizer ---------------------------------------------


@pytest.mark.slow
def test_encode_decode_round_trip(smollm2: Tokenizer, smollm2_tokenizer: Any) -> None:
    ids = smollm2.encode(TEXT)
    assert ids == smollm2_tokenizer.encode(TEXT, add_special_tokens=False)
    assert smollm2.decode(ids) == TEXT
    assert all(isinstance(i, int) for i in ids)


@pytest.mark.slow
def test_decode_skips_special_tokens_and_ids_past_the_vocab(smollm2: Tokenizer) -> None:
    ids = [*smollm2.encode("Hi"), 2]
    assert smollm2.decode(ids) == "Hi"
    assert smollm2.decode(ids, skip_special_tokens=False) == "Hi<|im_end|>"
    assert smollm2.decode([49151 + 100]) == ""
    assert smollm2.convert_ids_to_tokens(smollm2.encode(" world")) == ["Ġworld"]


@pytest.mark.slow
def test_chat_template_matches_transformers(smollm2: Tokenizer, smollm2_tokenizer: Any) -> None:
    for add_generation_prompt in (True, False):
        expected = smollm2_tokenizer.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        assert smollm2.apply_chat_template(CHAT, add_generation_prompt) == expected
    assert smollm2.has_chat_template
    text = smollm2.apply_chat_template(CHAT)
    assert text.endswith("<|im_start|>assistant\n")
    assert smollm2.encode_chat(CHAT) == smollm2_tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.slow
def test_properties(smollm2: Tokenizer) -> None:
    assert smollm2.vocab_size == 49152
    assert smollm2.eos_token_ids == frozenset({2})
    assert smollm2.bos_token_id == 1
    assert isinstance(smollm2, TokenizerLike)


@pytest.mark.slow
def test_load_tokenizer_smollm2() -> None:
    tok = load_tokenizer("smollm2")
    assert isinstance(tok, Tokenizer)
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.has_chat_template


@pytest.mark.slow
@pytest.mark.parametrize("messages", BAD_MESSAGES)
def test_bad_messages_name_the_field(smollm2: Tokenizer, messages: Any) -> None:
    with pytest.raises(InvalidArgument) as e:
        smollm2.encode_chat(messages)
    assert e.value.field == "messages"


# --- Tokenizer over small hand-built tokenizers --------------------------------------------


def test_encode_chat_has_no_double_bos() -> None:
    tok = Tokenizer(_bos_adding_tokenizer(LLAMA_STYLE_TEMPLATE))
    assert tok.encode("hi", add_special_tokens=True)[0] == 1
    ids = tok.encode_chat(CHAT)
    assert ids[0] == 1
    assert ids.count(1) == 1
    assert (
        tok.decode(ids) == "[user] What is a radix tree?[assistant] A compressed trie.[assistant] "
    )


def test_model_vocab_and_eos_extend_the_tokenizers() -> None:
    tok = Tokenizer(_bos_adding_tokenizer(None), vocab_size=512, eos_token_ids=(7, 2))
    assert tok.vocab_size == 512
    assert tok.eos_token_ids == frozenset({2, 7})
    assert tok.bos_token_id == 1
    assert tok.decode([300, 500]) == ""


def test_tokenizer_without_template_uses_the_simple_one() -> None:
    tok = Tokenizer(_bos_adding_tokenizer(None))
    assert not tok.has_chat_template
    assert tok.apply_chat_template(CHAT, add_generation_prompt=False) == (
        "<|user|>\nWhat is a radix tree?\n<|assistant|>\nA compressed trie.\n"
    )


# Qwen3's switch, as its template spells it: an empty think block when thinking is off.
THINKING_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] "
    "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}"
    "{% endif %}"
    "{% if strict is defined and messages|length > 1 %}"
    "{{ raise_exception('one message only') }}{% endif %}"
)


def test_chat_template_kwargs_are_the_templates_variables() -> None:
    tok = Tokenizer(_bos_adding_tokenizer(THINKING_TEMPLATE))
    plain = "[user] What is a radix tree?\n[assistant] A compressed trie.\n[assistant] "
    assert tok.apply_chat_template(CHAT) == plain
    assert tok.apply_chat_template(CHAT, template_kwargs={"enable_thinking": True}) == plain
    off = tok.apply_chat_template(CHAT, template_kwargs={"enable_thinking": False})
    assert off == plain + "<think></think>"
    assert tok.decode(tok.encode_chat(CHAT, True, {"enable_thinking": False})) == off


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tokenize": True}, "'tokenize' is the template call's own"),
        ({"messages": []}, "'messages' is the template call's own"),
        ({"not a name": 1}, "'not a name' is not a variable name"),
        ({f"v{i}": i for i in range(33)}, "at most 32 variables, got 33"),
        ({"strict": True}, "the chat template failed with them: one message only"),
    ],
)
def test_bad_chat_template_kwargs_name_the_field(kwargs: dict[str, Any], message: str) -> None:
    tok = Tokenizer(_bos_adding_tokenizer(THINKING_TEMPLATE))
    renders = [tok.apply_chat_template]
    if "failed" not in message:  # the simple template (no variables) checks their names too
        renders.append(ByteTokenizer(256).apply_chat_template)
        renders.append(Tokenizer(_bos_adding_tokenizer(None)).apply_chat_template)
    for render in renders:
        with pytest.raises(InvalidArgument, match=message) as e:
            render(CHAT, True, kwargs)
        assert e.value.field == "chat_template_kwargs"


# --- ByteTokenizer -------------------------------------------------------------------------


def test_byte_tokenizer_round_trip() -> None:
    tok = ByteTokenizer(512, eos_token_ids=(300,), bos_token_id=301)
    ids = tok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8"))
    assert tok.decode(ids) == TEXT
    assert tok.encode("a", add_special_tokens=True) == [301, 97]
    assert isinstance(tok, TokenizerLike)


def test_byte_tokenizer_ids_past_bytes_decode_to_nothing() -> None:
    tok = ByteTokenizer(128256, eos_token_ids=(128001,))
    assert tok.decode([104, 300, 105, 128001]) == "hi"
    assert tok.decode([0xE4, 0xBD]) == "\ufffd"  # a cut-off character is replaced, not raised
    assert tok.convert_ids_to_tokens([104, 10, 300, 128256]) == ["h", "<0x0A>", "<|id_300|>", None]


def test_byte_tokenizer_special_bytes_are_skipped_on_request() -> None:
    tok = ByteTokenizer(512, eos_token_ids=(2,), bos_token_id=1)
    assert tok.decode([1, 104, 2]) == "h"
    assert tok.decode([1, 104, 2], skip_special_tokens=False) == "\x01h\x02"


def test_byte_tokenizer_chat() -> None:
    tok = ByteTokenizer(512)
    text = tok.apply_chat_template(CHAT)
    assert text == (
        "<|user|>\nWhat is a radix tree?\n<|assistant|>\nA compressed trie.\n<|assistant|>\n"
    )
    assert tok.encode_chat(CHAT) == list(text.encode())
    assert tok.has_chat_template


@pytest.mark.parametrize("messages", BAD_MESSAGES)
def test_byte_tokenizer_bad_messages(messages: Any) -> None:
    with pytest.raises(InvalidArgument) as e:
        ByteTokenizer(512).apply_chat_template(messages)
    assert e.value.field == "messages"


def test_byte_tokenizer_needs_256_ids() -> None:
    with pytest.raises(InvalidArgument) as e:
        ByteTokenizer(255)
    assert e.value.field == "vocab_size"


def test_load_tokenizer_dummy() -> None:
    tok = load_tokenizer("dummy:tiny")
    assert isinstance(tok, ByteTokenizer)
    assert (tok.vocab_size, tok.eos_token_ids, tok.bos_token_id) == (512, frozenset({2}), 1)
