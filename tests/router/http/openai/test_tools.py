"""Tool calling: the call grammar (and the calls it allows), rendering, bad tools, and the
`openai` client against the bundled model (tool_choice required, a named function, auto;
streamed deltas; a two-turn conversation). Arguments are checked against their schema."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import openai
import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.openai import requests as rq
from radixmesh.router.http.openai.convert import parse_chat
from radixmesh.router.http.openai.tool_parsers import PARSERS, ToolCallSplitter
from radixmesh.router.http.openai.tools import (
    PARALLEL_CALLS_LIMIT,
    prompt_ids,
    structural_tag,
    syntax_of,
)
from radixmesh.tokenizer import Tokenizer
from tests.router.http.openai.conftest import MODEL, Smollm2Cluster

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the local time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_call(call: Any) -> dict[str, Any]:
    """A tool call's arguments, validated against its function's schema."""
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return dict(arguments)


# ---- the call grammar -----------------------------------------------------------------------


OSLO = '{"city": "Oslo", "unit": "celsius"}'
# Each syntax: the text of one get_weather call, how calls are joined, around them.
SYNTAXES = {
    "hermes": ('<tool_call>\n{"name": "get_weather", "arguments": ' + OSLO + "}\n</tool_call>",
               "\n", "", ""),
    "llama3": ('{"name": "get_weather", "parameters": ' + OSLO + "}", ";", "", ""),
    "mistral": ('{"name": "get_weather", "arguments": ' + OSLO + "}", ", ", "[TOOL_CALLS][", "]"),
}  # fmt: skip


def calls_text(syntax: str, n: int) -> str:
    """`n` get_weather calls (Oslo, celsius) as a model writes them in `syntax`."""
    one, between, head, tail = SYNTAXES[syntax]
    return head + between.join([one] * n) + tail


@pytest.mark.parametrize("syntax", sorted(SYNTAXES))
def test_the_grammar_accepts_what_the_parser_reads(syntax: str) -> None:
    functions = [rq.FunctionDefinition.model_validate(t["function"]) for t in (WEATHER, TIME)]
    grammar = xgr.Grammar.from_structural_tag(structural_tag(functions, syntax, max_calls=2))
    output = calls_text(syntax, 1)
    assert _is_grammar_accept_string(grammar, output)
    assert not _is_grammar_accept_string(grammar, output.replace("celsius", "kelvin"))
    assert not _is_grammar_accept_string(grammar, "Sure! " + output)  # calls and nothing else
    assert not _is_grammar_accept_string(grammar, "")  # at least one call
    splitter = ToolCallSplitter(PARSERS[syntax]())
    content, calls = splitter.feed(output)
    rest, more = splitter.finish()
    assert (content + rest, [(c.name, json.loads(c.arguments)) for c in calls + more]) == (
        "",
        [("get_weather", {"city": "Oslo", "unit": "celsius"})],
    )
    one = xgr.Grammar.from_structural_tag(structural_tag(functions[1:], syntax, max_calls=1))
    assert not _is_grammar_accept_string(one, output)  # only get_time


@pytest.mark.parametrize("syntax", sorted(SYNTAXES))
def test_the_grammar_ends_after_the_calls_allowed(syntax: str) -> None:
    functions = [rq.FunctionDefinition.model_validate(WEATHER["function"])]
    for max_calls in (1, 3):
        grammar = xgr.Grammar.from_structural_tag(structural_tag(functions, syntax, max_calls))
        accepted = [
            n for n in range(5) if _is_grammar_accept_string(grammar, calls_text(syntax, n))
        ]
        assert accepted == list(range(1, max_calls + 1))
    with pytest.raises(ValueError, match="max_calls"):
        structural_tag(functions, syntax, 0)


@pytest.mark.parametrize(
    ("choice", "parallel", "max_calls"),
    [
        ("required", None, PARALLEL_CALLS_LIMIT),
        ("required", True, PARALLEL_CALLS_LIMIT),
        ("required", False, 1),
        ({"type": "function", "function": {"name": "get_time"}}, None, 1),
        ({"type": "function", "function": {"name": "get_time"}}, True, 1),
    ],
)
def test_the_request_sets_how_many_calls(
    smollm2_tokenizer: Any, choice: Any, parallel: bool | None, max_calls: int
) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": ASK, "tools": [WEATHER, TIME]}
    body |= {"tool_choice": choice} | (
        {} if parallel is None else {"parallel_tool_calls": parallel}
    )
    gen = parse_chat(body, tokenizer=Tokenizer(smollm2_tokenizer), context_length=8192)
    assert gen.tool_plan is not None
    names = ["get_time"] if isinstance(choice, dict) else ["get_weather", "get_time"]
    functions = [rq.FunctionDefinition.model_validate(t["function"]) for t in (WEATHER, TIME)]
    expected = structural_tag([f for f in functions if f.name in names], "hermes", max_calls)
    assert gen.tool_plan.structural_tag == expected
    grammar = xgr.Grammar.from_structural_tag(expected)
    two = calls_text("hermes", 2).replace("get_weather", names[0])
    assert _is_grammar_accept_string(grammar, two) == (max_calls > 1)


# ---- rendering ------------------------------------------------------------------------------

TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}"
    "{% endfor %}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function | tojson }}</call>"
    "{% endfor %}{% else %}{{ m.content }}{% endif %}{% if m.role == 'tool' %} "
    "({{ m.name }}, {{ m.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATION: Any = [
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"},
]


@pytest.fixture(scope="module")
def tool_tokenizer(smollm2_tokenizer: Any) -> Tokenizer:
    """The bundled tokenizer with a chat template that has a tool section."""
    hf = copy.copy(smollm2_tokenizer)
    hf.chat_template = TOOL_TEMPLATE
    return Tokenizer(hf)


def test_a_template_with_a_tool_section_renders_tools_itself(tool_tokenizer: Tokenizer) -> None:
    req = rq.ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": CONVERSATION, "tools": [WEATHER]}
    )
    text = tool_tokenizer.decode(prompt_ids(req, tool_tokenizer), skip_special_tokens=False)
    assert text == (
        "<|im_start|>system\nTools: get_weather<|im_end|>\n<|im_start|>user\nWeather in Oslo?"
        '<|im_end|>\n<|im_start|>assistant\n<call>{"name": "get_weather", "arguments": '
        '{"city": "Oslo"}}</call><|im_end|>\n<|im_start|>tool\n-3 C (get_weather, call_1)'
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert syntax_of(tool_tokenizer) == "hermes"  # no marker in this template: the default
    assert syntax_of(tool_tokenizer, "mistral") == "mistral"


def test_the_fallback_renders_tools_into_the_messages(smollm2_tokenizer: Any) -> None:
    tok = Tokenizer(smollm2_tokenizer)
    assert not tok.supports_tools
    req = rq.ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": CONVERSATION, "tools": [WEATHER]}
    )
    text = tok.decode(prompt_ids(req, tok), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou can call functions")
    assert json.dumps(WEATHER) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
        '"Oslo"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n-3 C\n'
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in text


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{**WEATHER, "function": {**WEATHER["function"], "parameters": {
            "type": "object", "properties": {"city": {"type": "bogus"}}}}}]},
         "tools[0].function.parameters"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
         "tools[0].function.name"),
        ({"tools": [WEATHER], "tool_choice": "required", "regex": "a+"}, "tool_choice"),
        ({"messages": [*CONVERSATION[:2], {"role": "tool", "content": "-3 C"}]},
         "messages[2].tool_call_id"),
        ({"messages": [CONVERSATION[0], {**CONVERSATION[1], "tool_calls": [{
            **CONVERSATION[1]["tool_calls"][0], "function": {"name": "get_weather",
                                                           "arguments": "{city"}}]}]},
         "messages[1].tool_calls[0].function.arguments"),
    ],
)  # fmt: skip
def test_bad_tools_name_the_field(
    smollm2_tokenizer: Any, fields: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "messages": ASK, **fields}
    with pytest.raises(InvalidArgument) as e:
        parse_chat(body, tokenizer=Tokenizer(smollm2_tokenizer), context_length=8192)
    assert e.value.field == param


# ---- the bundled model through the openai client ---------------------------------------------

slow = pytest.mark.slow


@slow
def test_required_and_named_calls_follow_the_schema(smollm2: Smollm2Cluster) -> None:
    client = smollm2.client
    out = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=100,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert check_call(call)["city"] == "Paris"
    named = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=100,
    )
    (call,) = named.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_time"
    assert check_call(call) == {"city": "Paris"}
    # Sampled (not greedy) calls follow the schema too.
    sampled = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=5,
        n=3,
        max_tokens=100,
    )
    for c in sampled.choices:
        assert c.finish_reason == "tool_calls"
        for call in c.message.tool_calls or []:
            check_call(call)


@slow
def test_auto_parses_the_models_own_call(smollm2: Smollm2Cluster) -> None:
    # One example call in the history: the small model answers the next question alike.
    messages: Any = [
        {"role": "user", "content": "What is the weather in Berlin?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Berlin", "unit": "celsius"}',
                    },
                }
            ],
        },
        {"role": "user", "content": "What is the weather in Rome?"},
    ]
    out = smollm2.client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER, TIME], temperature=0, max_tokens=60
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert check_call(call)["city"] == "Rome"
    # tool_choice none: the same reply is plain content.
    plain = smollm2.client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[WEATHER, TIME],
        tool_choice="none",
        temperature=0,
        max_tokens=60,
    )
    assert plain.choices[0].message.tool_calls is None
    assert (plain.choices[0].message.content or "").startswith("<tool_call>")


@slow
def test_streamed_call_deltas_reassemble(smollm2: Smollm2Cluster) -> None:
    args: Any = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 100,
        "parallel_tool_calls": False,
    }
    whole = smollm2.client.chat.completions.create(**args)
    with smollm2.client.chat.completions.stream(**args) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    streamed = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    expected = whole.choices[0].message.tool_calls or []
    assert streamed == [(c.function.name, c.function.arguments) for c in expected]


@slow
def test_two_turn_tool_conversation(smollm2: Smollm2Cluster) -> None:
    client = smollm2.client
    first = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=100,
    )
    reply = first.choices[0].message
    (call,) = reply.tool_calls or []
    assert call.type == "function"
    messages: Any = [
        *ASK,
        reply.model_dump(exclude_none=True),  # the assistant's turn, as the client has it
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], temperature=0, max_tokens=30
    )
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].message.content
    # The second prompt carried the call and its result.
    prompt = smollm2.http.post("/tokenize", {"messages": messages, "tools": [WEATHER]}).json()
    text = smollm2.http.post("/detokenize", {"tokens": prompt["tokens"]}).json()["prompt"]
    assert call.function.arguments in text
    assert '<tool_response>\n{"temperature": 21}\n</tool_response>' in text
    assert second.usage is not None and second.usage.prompt_tokens == prompt["count"]


@slow
def test_a_schema_the_grammar_cannot_compile_is_400_quoting_it(smollm2: Smollm2Cluster) -> None:
    tool = copy.deepcopy(WEATHER)
    tool["function"]["parameters"]["properties"]["city"]["pattern"] = "(?<=a)b"
    with pytest.raises(openai.BadRequestError) as e:
        smollm2.client.chat.completions.create(
            model=MODEL, messages=ASK, tools=[tool], tool_choice="required", max_tokens=20
        )
    err = e.value.body
    assert isinstance(err, dict)
    assert err["param"] == "tools"
    assert "Lookbehind is not supported" in err["message"]
