"""Each tool-call syntax on model outputs, whole and streamed piece by piece: calls out,
no markup left in content (a call cut off by the end of the reply is dropped), no call
twice.

The hermes outputs were recorded from the bundled smollm2 through the router (with and
without the call grammar). smollm2 cannot speak the llama3 and mistral syntaxes and no
such model is available offline, so their outputs are written in each family's
documented format (Llama 3.1's JSON tool calls, Mistral's `[TOOL_CALLS]` list).
"""

from __future__ import annotations

import json

import pytest

from radixmesh.router.http.openai.tool_parsers import (
    PARSERS,
    ParsedCall,
    ToolCallSplitter,
    json_end,
)


def split(syntax: str, text: str, piece: int = 0) -> tuple[str, list[ParsedCall]]:
    """The whole text at once (piece 0), or fed `piece` characters at a time."""
    s = ToolCallSplitter(PARSERS[syntax]())
    if piece == 0:
        content, calls = s.feed(text)
    else:
        content, calls = "", []
        for i in range(0, len(text), piece):
            c, more = s.feed(text[i : i + piece])
            content, calls = content + c, calls + more
    rest, last = s.finish()
    return content + rest, calls + last


def args(call: ParsedCall) -> object:
    return json.loads(call.arguments)


# (syntax, output, content, [(name, arguments)])
CASES = [
    (  # smollm2 under the call grammar (tool_choice required, parallel calls off)
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": { "city" : "Paris" , "unit" : '
        '"celsius" }}\n</tool_call>',
        "",
        [("get_weather", {"city": "Paris", "unit": "celsius"})],
    ),
    (  # smollm2 under the grammar with parallel calls, cut by max_tokens mid-call
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {\n    "city" : "Paris",\n    '
        '"unit" : "celsius"\n}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {\n    "city" : "Paris",\n    "unit" : "fahrenheit"\n',
        "",
        [("get_weather", {"city": "Paris", "unit": "celsius"})],
    ),
    (  # smollm2 repeating its calls (the grammar allowed more), cut in a start marker
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "unit": "fahrenheit"}}\n</tool_call>\n<tool_call>\n{"name": '
        '"get_weather", "arguments": {"unit": "celsius",  "city": "Paris"}}\n</tool_call>\n'
        "<tool_",
        "",
        [
            ("get_weather", {"city": "Paris", "unit": "celsius"}),
            ("get_weather", {"city": "Paris", "unit": "fahrenheit"}),
        ],
    ),
    (  # cut right after the start marker, text before it kept
        "hermes",
        "Checking.\n<tool_call>",
        "Checking.\n",
        [],
    ),
    (  # smollm2 with tool_choice auto, after a one-shot example
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"fahrenheit"}}\n</tool_call>',
        "",
        [("get_weather", {"city": "Paris", "unit": "fahrenheit"})],
    ),
    (  # smollm2 answering without a call: all content
        "hermes",
        "The weather in Paris is quite unique. Paris is a city known for its vibrant culture",
        "The weather in Paris is quite unique. Paris is a city known for its vibrant culture",
        [],
    ),
    (  # text, then two calls (Qwen 2.5 style), a closing tag on its own line
        "hermes",
        'Let me check both.\n<tool_call>\n{"name": "get_time", "arguments": {"city": '
        '"Tokyo"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Tokyo", "unit": "celsius"}}\n</tool_call>',
        "Let me check both.\n",
        [("get_time", {"city": "Tokyo"}), ("get_weather", {"city": "Tokyo", "unit": "celsius"})],
    ),
    (  # a block that is no call (no name) is dropped, the text after it kept
        "hermes",
        'Hm. <tool_call>\n{"arguments": {}}\n</tool_call> done',
        "Hm. done",
        [],
    ),
    (  # the marker in prose opens markup all the same: what follows it is dropped
        "hermes",
        "Use the <tool_call> tag.",
        "Use the ",
        [],
    ),
    (  # Llama 3.1: the reply is the call, "parameters" for the arguments
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "San Francisco", "unit": "celsius"}}',
        "",
        [("get_weather", {"city": "San Francisco", "unit": "celsius"})],
    ),
    (  # Llama 3.1 built-in tool style: after <|python_tag|>, two calls joined by ;
        "llama3",
        '<|python_tag|>{"name": "get_time", "parameters": {"city": "Oslo"}}; '
        '{"name": "get_time", "parameters": {"city": "Lima"}}',
        "",
        [("get_time", {"city": "Oslo"}), ("get_time", {"city": "Lima"})],
    ),
    (  # Llama 3 answering in prose that mentions braces: content
        "llama3",
        'Sure! The JSON is {"name": "x"} as you asked.',
        'Sure! The JSON is {"name": "x"} as you asked.',
        [],
    ),
    (  # JSON that is not a call, at the start: content
        "llama3",
        '{"answer": 42}',
        '{"answer": 42}',
        [],
    ),
    (  # such JSON cut off: content
        "llama3",
        '{"answer": 4',
        '{"answer": 4',
        [],
    ),
    (  # a second call cut off: dropped
        "llama3",
        '{"name": "get_time", "parameters": {"city": "Oslo"}}; {"name": "get_time", "par',
        "",
        [("get_time", {"city": "Oslo"})],
    ),
    (  # the only call cut off inside its name: dropped
        "llama3",
        '{"na',
        "",
        [],
    ),
    (  # Mistral: a list of calls after [TOOL_CALLS]
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice", "unit": '
        '"celsius"}}, {"name": "get_time", "arguments": {"city": "Nice"}}]',
        "",
        [("get_weather", {"city": "Nice", "unit": "celsius"}), ("get_time", {"city": "Nice"})],
    ),
    (  # Mistral with prose before the calls, arguments with nested brackets and a brace
        "mistral",
        'Checking. [TOOL_CALLS] [{"name": "search", "arguments": {"q": "a}b", "tags": '
        '["x", {"y": [1]}]}}]',
        "Checking. ",
        [("search", {"q": "a}b", "tags": ["x", {"y": [1]}]})],
    ),
    (  # Mistral's list cut off in its second call: the first is kept
        "mistral",
        '[TOOL_CALLS][{"name": "get_time", "arguments": {"city": "Nice"}}, {"name": "get_ti',
        "",
        [("get_time", {"city": "Nice"})],
    ),
    (  # the same call twice in Mistral's list: once
        "mistral",
        '[TOOL_CALLS][{"name": "get_time", "arguments": {"city": "Nice"}}, '
        '{"name": "get_time", "arguments": {"city": "Nice"}}]',
        "",
        [("get_time", {"city": "Nice"})],
    ),
]


@pytest.mark.parametrize(("syntax", "output", "content", "calls"), CASES)
@pytest.mark.parametrize("piece", [0, 1, 3, 7])
def test_outputs(
    syntax: str, output: str, content: str, calls: list[tuple[str, object]], piece: int
) -> None:
    got_content, got_calls = split(syntax, output, piece)
    assert got_content == content
    assert [(c.name, args(c)) for c in got_calls] == calls


def test_text_that_may_begin_a_call_is_held_until_it_cannot() -> None:
    s = ToolCallSplitter(PARSERS["hermes"]())
    assert s.feed("Hi <tool") == ("Hi ", [])
    assert s.feed("box>") == ("<toolbox>", [])
    assert s.feed("<tool_call>\n{") == ("", [])
    content, calls = s.feed('"name": "f", "arguments": {}}\n</tool_call>\n')
    assert (content, [(c.name, c.arguments) for c in calls]) == ("", [("f", "{}")])
    assert s.finish() == ("", [])  # the whitespace after a call is not content


def test_arguments_given_as_json_text_are_kept() -> None:
    content, calls = split("hermes", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}')
    assert (content, calls) == ("", [ParsedCall("f", '{"a": 1}')])
    content, calls = split("hermes", '<tool_call>{"name": "f", "arguments": "not json"}')
    assert (content, calls) == ("", [])


def test_whitespace_alone_is_content() -> None:
    for syntax in PARSERS:
        assert split(syntax, "\n ") == ("\n ", [])


def test_json_end() -> None:
    text = '{"a": "}]\\"", "b": [1, {"c": 2}]} tail'
    assert json_end(text, 0) == text.index(" tail")
    assert json_end('{"a": [1, 2', 0) is None
    assert json_end('["x", "y"]', 0) == 10
