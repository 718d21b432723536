"""OpenAI request bodies -> the router's terms: validation, field names, unknown fields."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.openai.convert import error_param, parse_chat, parse_completion
from radixmesh.tokenizer import ByteTokenizer

TOK = ByteTokenizer(256, eos_token_ids=[0])
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TEXT = {"model": "m", "prompt": "hi"}
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


def chat(**fields: Any) -> Any:
    return parse_chat({**CHAT, **fields}, tokenizer=TOK, context_length=64)


def completion(**fields: Any) -> Any:
    return parse_completion({**TEXT, **fields}, tokenizer=TOK, context_length=64)


def field_of(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(InvalidArgument) as e:
        fn(*args, **kwargs)
    return e.value.field


def test_fields_map_to_sampling_params() -> None:
    gen = completion(max_tokens=5, temperature=0.5, top_k=3, stop=["x"], seed=7, n=2)
    assert gen.prompts == [list(b"hi")]
    assert [p.max_new_tokens for p in gen.params] == [5, 5]
    assert [p.seed for p in gen.params] == [7, 8]  # the n choices of one seed differ
    assert (gen.params[0].temperature, gen.params[0].top_k) == (0.5, 3)
    assert list(gen.params[0].stop) == ["x"]
    assert completion().params[0].max_new_tokens == 16  # OpenAI's completions default
    # Chat: what the context leaves, unless max_tokens or max_completion_tokens says.
    prompt_len = len(chat().prompts[0])
    assert chat().params[0].max_new_tokens == 64 - prompt_len
    assert chat(max_tokens=3, max_completion_tokens=4).params[0].max_new_tokens == 4


def test_speculative_is_sent_only_when_a_request_opts_out() -> None:
    for gen in (chat(speculative=False), completion(speculative=False, n=2)):
        assert [(p.HasField("speculative"), p.speculative) for p in gen.params] == [
            (True, False)
        ] * len(gen.params)
    for gen in (chat(), chat(speculative=True), completion(speculative=True)):
        assert gen.params[0].HasField("speculative") is False  # the default: it may draft


def test_unknown_fields_are_ignored_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "radixmesh.router.http.openai.convert"):
        first = chat(frobnicate_once=1, user="u", metadata={"a": "b"}, store=False)
        chat(frobnicate_once=2)
    assert first.params == chat().params
    logged = [r.getMessage() for r in caplog.records]
    assert logged == ["ignoring the unknown request field 'frobnicate_once' (reported once)"]


def test_strict_refuses_unknown_fields_by_name() -> None:
    body = {**CHAT, "zeta": 1, "alpha": 2, "user": "u"}
    assert field_of(parse_chat, body, tokenizer=TOK, context_length=64, strict=True) == "alpha"
    # Known fields that are accepted and ignored stay fine when strict.
    parse_chat({**CHAT, "user": "u"}, tokenizer=TOK, context_length=64, strict=True)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": -1}, "temperature"),  # the shared SamplingParams check
        ({"temperature": "hot"}, "temperature"),  # strict types: a string is no number
        ({"max_tokens": True}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"n": 17}, "n"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "user", "content": [IMAGE]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # needs stream
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"model": None}, "model"),
        ({"speculative": "x"}, "speculative"),
    ],
)
def test_chat_errors_name_the_field(fields: dict[str, Any], param: str) -> None:
    assert field_of(chat, **fields) == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["ok", ""]}, "prompt[1]"),
        ({"prompt": [1, 300]}, "prompt"),  # outside the vocabulary
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"logprobs": 21}, "logprobs"),
        ({"best_of": 3}, "best_of"),
        ({"echo": True, "logprobs": 0, "stream": True}, "echo"),
        ({"logit_bias": {"one": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 100.5}}, "logit_bias"),
        ({"suffix": "tail"}, "suffix"),
        ({"speculative": 1}, "speculative"),  # strict types: 1 is not true
    ],
)
def test_completion_errors_name_the_field(fields: dict[str, Any], param: str) -> None:
    assert field_of(completion, **fields) == param


def test_echo_and_logit_bias() -> None:
    gen = completion(prompt=["ab", [99, 100]], echo=True, logprobs=1, logit_bias={"7": -100})
    assert gen.echo == ["ab", "cd"]  # token prompts are decoded
    assert gen.params[0].logprob_start_len == 0  # the prompt's logprobs from the first token
    assert dict(gen.params[0].logit_bias) == {7: -100.0}
    assert completion(echo=True).params[0].HasField("logprob_start_len") is False


def test_a_body_that_is_not_an_object() -> None:
    assert field_of(parse_chat, [1], tokenizer=TOK, context_length=64) == "body"


def test_error_param_drops_tags_and_class_names() -> None:
    assert error_param(("messages", 2, "role tool", "tool_call_id")) == "messages[2].tool_call_id"
    assert error_param(("tool_choice", "NamedToolChoice", "function", "name")) == (
        "tool_choice.function.name"
    )
    assert error_param(("tool_choice", "literal['none','auto','required']")) == "tool_choice"
    assert error_param(()) == "body"


def test_chat_messages_render_with_the_template() -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    gen = chat(messages=messages)
    assert bytes(gen.prompts[0]).decode() == "<|system|>\nbe brief\n<|user|>\nab\n<|assistant|>\n"
