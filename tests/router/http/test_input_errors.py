"""What OpenAI's and Anthropic's clients are told when their request cannot be served: a
content part the text-only model cannot read, and a prompt that leaves no room for the
tokens asked for, each named in the API's own terms.

The router's HTTP front end with a 64-token model and no worker (tests/router/http/
openai/frontend.py): both are refused before any worker is asked. A chat of one "hi"
message renders to 26 tokens with the byte tokenizer's template.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from radixmesh.tokenizer import ByteTokenizer
from tests.router.http.openai.frontend import Frontend

MODEL = "dummy:tiny"
HI = [{"role": "user", "content": "hi"}]
IMAGE_URL = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
FILE = {"type": "file", "file": {"file_id": "file-1"}}


@pytest.fixture(scope="module")
def frontend() -> Iterator[Frontend]:
    f = Frontend(ByteTokenizer(256, eos_token_ids=[0]), MODEL, context_length=64)
    yield f
    f.close()


@pytest.fixture(scope="module")
def gpt(frontend: Frontend) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=frontend.url + "/v1", api_key="k", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def claude(frontend: Frontend) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=frontend.url, api_key="k", max_retries=0) as client:
        yield client


def openai_error(e: pytest.ExceptionInfo[openai.BadRequestError]) -> tuple[str, str]:
    body: Any = e.value.body
    assert (e.value.status_code, body["type"], body["code"]) == (
        400,
        "invalid_request_error",
        "invalid_argument",
    )
    return body["param"], body["message"]


def anthropic_error(e: pytest.ExceptionInfo[anthropic.BadRequestError]) -> str:
    body: Any = e.value.body
    assert (e.value.status_code, body["type"], body["error"]["type"]) == (
        400,
        "error",
        "invalid_request_error",
    )
    return str(body["error"]["message"])


# ---- content the model cannot read -------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "kind"), [(IMAGE_URL, "image_url"), (AUDIO, "input_audio"), (FILE, "file")]
)
def test_chat_names_the_part_the_model_cannot_read(
    gpt: openai.OpenAI, part: dict[str, Any], kind: str
) -> None:
    content = [{"type": "text", "text": "What is this?"}, part]
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": content},
    ]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            gpt.chat.completions.create(model=MODEL, messages=messages, stream=stream)
        assert openai_error(e) == (
            "messages[1].content[1]",
            f"{kind} content parts are not supported: the served model takes text only",
        )


def test_chat_content_still_takes_strings_and_text_parts(gpt: openai.OpenAI) -> None:
    """Valid text content passes validation: with no worker to ask, the answer is a 503."""
    for content in ("hi", [{"type": "text", "text": "hi"}]):
        messages: Any = [{"role": "user", "content": content}]
        with pytest.raises(openai.InternalServerError) as e:
            gpt.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        assert e.value.status_code == 503


def test_chat_bad_part_type_and_content_type_are_named(gpt: openai.OpenAI) -> None:
    bad_type: Any = [{"role": "user", "content": [{"type": "video", "video": "x"}]}]
    with pytest.raises(openai.BadRequestError) as e:
        gpt.chat.completions.create(model=MODEL, messages=bad_type)
    assert openai_error(e) == (
        "messages[0].content[0]",
        "type must be text (the served model takes text only)",
    )
    not_text: Any = [{"role": "user", "content": 5}]
    with pytest.raises(openai.BadRequestError) as e:
        gpt.chat.completions.create(model=MODEL, messages=not_text)
    assert openai_error(e) == ("messages[0].content", "Input should be a valid list")


def test_responses_names_the_part_the_model_cannot_read(gpt: openai.OpenAI) -> None:
    content: Any = [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "auto"},
    ]
    with pytest.raises(openai.BadRequestError) as e:
        gpt.responses.create(model=MODEL, input=[{"role": "user", "content": content}])
    assert openai_error(e) == (
        "input[0].content[1]",
        "input_image is not supported: the served model reads text only",
    )


def test_messages_names_the_block_the_model_cannot_read(claude: anthropic.Anthropic) -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    pdf = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
    for block, kind in ((image, "image"), (pdf, "document")):
        content: Any = [{"type": "text", "text": "What is this?"}, block]
        with pytest.raises(anthropic.BadRequestError) as e:
            claude.messages.create(
                model=MODEL, max_tokens=4, messages=[{"role": "user", "content": content}]
            )
        assert anthropic_error(e) == (
            f"messages[0].content[1]: {kind} blocks are not supported: the served model reads "
            "text only"
        )


# ---- a prompt and its tokens past the context --------------------------------------------------


def test_chat_overflow_names_the_field_sent(gpt: openai.OpenAI) -> None:
    messages: Any = HI
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            gpt.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=60, stream=stream
            )
        assert openai_error(e) == (
            "max_tokens",
            "prompt (26 tokens) + max_tokens (60) exceeds the context length (64)",
        )
        with pytest.raises(openai.BadRequestError) as e:
            gpt.chat.completions.create(
                model=MODEL, messages=messages, max_completion_tokens=60, stream=stream
            )
        assert openai_error(e) == (
            "max_completion_tokens",
            "prompt (26 tokens) + max_completion_tokens (60) exceeds the context length (64)",
        )


def test_completions_and_responses_overflow_name_their_fields(gpt: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        gpt.completions.create(model=MODEL, prompt="hi", max_tokens=63)
    assert openai_error(e) == (
        "max_tokens",
        "prompt (2 tokens) + max_tokens (63) exceeds the context length (64)",
    )
    with pytest.raises(openai.BadRequestError) as e:
        gpt.responses.create(model=MODEL, input="hi", max_output_tokens=60)
    assert openai_error(e) == (
        "max_output_tokens",
        "prompt (26 tokens) + max_output_tokens (60) exceeds the context length (64)",
    )


def test_messages_overflow_names_max_tokens(claude: anthropic.Anthropic) -> None:
    messages: Any = HI
    expected = "max_tokens: prompt (26 tokens) + max_tokens (60) exceeds the context length (64)"
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=60, messages=messages)
    assert anthropic_error(e) == expected
    streamed = claude.messages.stream(model=MODEL, max_tokens=60, messages=messages)
    with pytest.raises(anthropic.BadRequestError) as e, streamed as stream:
        stream.until_done()
    assert anthropic_error(e) == expected
