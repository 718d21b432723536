"""Structured output on completions and chat through the real `openai` and `litellm`
clients: OpenAI's `response_format` (completions too), vLLM's `guided_*` fields and
`structured_outputs`; a second constraint or an unknown field is a 400 naming it.

The refusals are checked on a router without workers (dummy:tiny: validation answers
before routing); the constraints' effect on the bundled model (greedy, so each answer is
exact)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import openai
import pytest

from radixmesh.tokenizer import ByteTokenizer
from tests.router.http.openai.conftest import MODEL, Smollm2Cluster
from tests.router.http.openai.frontend import Frontend

TINY = "dummy:tiny"
YES_NO: Any = [{"role": "user", "content": "Is Paris the capital of France? Answer yes or no."}]
EIFFEL = "The Eiffel Tower was completed in the year"
WHERE = "Where is the Eiffel Tower, and when was it completed? Answer in JSON:"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
    },
    "required": ["city", "year"],
}


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    """The `litellm` package (imported here: its import takes seconds)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    import litellm

    return litellm


@pytest.fixture(scope="module")
def strict() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), TINY)
    yield f
    f.close()


@pytest.fixture(scope="module")
def lenient() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), TINY, strict_openai=False)
    yield f
    f.close()


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_an_unknown_field_is_a_400_unless_the_router_is_lenient(
    strict: Frontend, lenient: Frontend
) -> None:
    args: Any = {"model": TINY, "prompt": "hi", "max_tokens": 2, "extra_body": {"frobnicate": 1}}
    with pytest.raises(openai.BadRequestError) as e:
        client_of(strict.url).completions.create(**args)
    assert (e.value.param, e.value.code) == ("frobnicate", "invalid_argument")
    assert e.value.message == "Error code: 400 - unknown or unsupported field 'frobnicate'"
    # Lenient: valid, and routed (no worker here answers: 503).
    with pytest.raises(openai.InternalServerError) as unavailable:
        client_of(lenient.url).completions.create(**args)
    assert unavailable.value.status_code == 503


def test_two_constraints_are_a_400_naming_the_second(strict: Frontend, litellm: ModuleType) -> None:
    extra = {"response_format": {"type": "json_object"}, "guided_regex": "[0-9]+"}
    with pytest.raises(openai.BadRequestError) as e:
        client_of(strict.url).completions.create(
            model=TINY, prompt="hi", max_tokens=2, extra_body=extra
        )
    assert (e.value.param, e.value.message) == (
        "guided_regex",
        "Error code: 400 - only one constraint may be given, got response_format and guided_regex",
    )
    # LiteLLM sends vLLM's fields as they are given (its hosted_vllm provider here).
    with pytest.raises(litellm.BadRequestError) as refused:
        litellm.completion(
            model="hosted_vllm/" + TINY,
            api_base=strict.url + "/v1",
            api_key="unused",
            messages=YES_NO,
            max_tokens=2,
            guided_choice=["yes", "no"],
            structured_outputs={"regex": "a"},
        )
    assert refused.value.status_code == 400
    body = json.loads(refused.value.message.split(" - ", 1)[1])
    assert body["error"]["param"] == "structured_outputs.regex"


@pytest.mark.slow
def test_choices_constrain_the_chat_answer(smollm2: Smollm2Cluster, litellm: ModuleType) -> None:
    client = smollm2.client
    args: Any = {"model": MODEL, "messages": YES_NO, "max_tokens": 16, "temperature": 0}
    plain = client.chat.completions.create(**args).choices[0].message.content
    assert plain is not None and plain.startswith("No, Paris is")  # unconstrained, it rambles
    guided = client.chat.completions.create(**args, extra_body={"guided_choice": ["yes", "no"]})
    assert guided.choices[0].message.content == "yes"
    stream = client.chat.completions.create(
        **args, stream=True, extra_body={"structured_outputs": {"choice": ["yes", "no"]}}
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "yes"
    via_litellm = litellm.completion(
        model="hosted_vllm/" + MODEL,
        api_base=str(client.base_url),
        api_key="unused",
        messages=YES_NO,
        max_tokens=16,
        temperature=0,
        guided_choice=["no", "yes"],
    )
    assert via_litellm.choices[0].message.content == "yes"


@pytest.mark.slow
def test_json_on_completions_in_each_dialect(smollm2: Smollm2Cluster) -> None:
    client = smollm2.client
    args: Any = {"model": MODEL, "prompt": WHERE, "max_tokens": 40, "temperature": 0}
    plain = client.completions.create(**args).choices[0].text
    assert plain.startswith("\n```\n{")  # unconstrained: a fenced, free-form object
    response_format = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
    texts = [
        client.completions.create(**args, extra_body=extra).choices[0].text
        for extra in (
            {"response_format": response_format},
            {"guided_json": SCHEMA},
            {"structured_outputs": {"json": SCHEMA}},
        )
    ]
    answer = json.loads(texts[0])
    assert set(answer) == {"city", "year"} and answer["city"] == "Paris"
    assert isinstance(answer["year"], int) and 1000 <= answer["year"] <= 2100
    assert texts[1:] == [texts[0], texts[0]]  # one constraint, whichever dialect named it
    any_object = (
        client.completions.create(**args, extra_body={"response_format": {"type": "json_object"}})
        .choices[0]
        .text
    )
    assert isinstance(json.loads(any_object), dict)


@pytest.mark.slow
def test_regex_and_grammar_on_completions(smollm2: Smollm2Cluster, litellm: ModuleType) -> None:
    client = smollm2.client
    args: Any = {"model": MODEL, "prompt": EIFFEL, "max_tokens": 8, "temperature": 0}
    assert client.completions.create(**args).choices[0].text.startswith(" 1889.")
    guided = client.completions.create(**args, extra_body={"guided_regex": " [0-9]{4}"})
    assert guided.choices[0].text == " 1889"  # the pattern ends it: no "." and no more
    grammar = 'root ::= " " ("1889" | "1999")'
    ebnf = client.completions.create(**args, extra_body={"guided_grammar": grammar})
    assert ebnf.choices[0].text == " 1889"
    via_litellm = litellm.text_completion(
        model="hosted_vllm/" + MODEL,
        api_base=str(client.base_url),
        api_key="unused",
        prompt=EIFFEL,
        max_tokens=8,
        temperature=0,
        guided_regex=" [0-9]{4}",
    )
    assert via_litellm.choices[0].text == " 1889"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        (
            {"guided_regex": "[0-9"},
            "guided_regex",
            "Regex parsing error at position 5: Unclosed '['",
        ),
        (
            {"guided_grammar": "start: x"},
            "guided_grammar",
            "invalid EBNF grammar: EBNF lexer error",
        ),
        (
            {"structured_outputs": {"json": "{not json"}},
            "structured_outputs.json",
            "invalid JSON schema: ",
        ),
    ],
)
def test_a_constraint_the_worker_cannot_compile_names_the_clients_field(
    smollm2: Smollm2Cluster, extra: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        smollm2.client.completions.create(
            model=MODEL, prompt=EIFFEL, max_tokens=4, extra_body=extra
        )
    assert e.value.param == param
    assert e.value.message.startswith("Error code: 400 - invalid ")
    assert says in e.value.message  # the compiler's words
