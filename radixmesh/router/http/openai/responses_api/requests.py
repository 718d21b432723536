"""OpenAI's Responses request body as pydantic models: field names, types and shapes.

Strict types and unknown-field handling as chat's models (openai/requests.py). `input`
may be a string, read as one user message, and a message's `content` may be a string,
read as one `input_text` part: errors inside then name an item or a part
(`input[2].content[0].text`) instead of "not a string" for a list holding one bad entry.

Items are told apart by `type`; a message may leave it out (OpenAI's "easy" input
message). Output items a client sends back (`response.output` of an earlier turn) are
input items too: an assistant message with `output_text` parts, `function_call`s.
`reasoning` items are declared and dropped (radixmesh makes none; a client may pass
through ones it got elsewhere). Parts the served model cannot read (images, files,
audio) are declared, so the conversion refuses them by name with a reason. An item's `id`
(output items sent back carry theirs) is kept for the stored response's `input_items`.

`InputTokensRequest` is the prompt's fields alone (`POST /v1/responses/input_tokens`);
`ResponsesRequest` adds what shapes the generation.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter, field_validator

from radixmesh.router.http.openai.requests import MAX_TOP_LOGPROBS, Body, Part
from radixmesh.router.http.sampling_fields import OPENAI_RANGES, sampling_field
from radixmesh.sampling_params import FIELD_DOCS


class InputText(Part):
    type: Literal["input_text", "output_text"]
    text: str


class Refusal(Part):
    type: Literal["refusal"]
    refusal: str


class Unreadable(Part):
    """Parts the served model cannot read: refused by the conversion."""

    type: Literal["input_image", "input_file", "input_audio"]


def _part_type(part: Any) -> str:
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    if kind in ("output_text", "input_image", "input_file", "input_audio"):
        kind = {"output_text": "input_text"}.get(kind, "unreadable")
    return f"part {kind}"


# Tags are not identifiers, so `error_param` leaves them out of the field path.
ContentPart = Annotated[
    Annotated[InputText, Tag("part input_text")]
    | Annotated[Refusal, Tag("part refusal")]
    | Annotated[Unreadable, Tag("part unreadable")],
    Discriminator(
        _part_type,
        custom_error_type="invalid_part_type",
        custom_error_message=(
            "type must be input_text, output_text, refusal (or input_image, input_file, "
            "input_audio, which are refused)"
        ),
    ),
]


def _as_parts(value: Any) -> Any:
    return [{"type": "input_text", "text": value}] if isinstance(value, str) else value


class MessageItem(Part):
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: list[ContentPart]

    _parts = field_validator(
        "content", mode="before", json_schema_input_type=str | list[ContentPart]
    )(_as_parts)


class FunctionCallItem(Part):
    type: Literal["function_call"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str  # JSON text


class FunctionCallOutputItem(Part):
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    output: list[ContentPart]

    _parts = field_validator(
        "output", mode="before", json_schema_input_type=str | list[ContentPart]
    )(_as_parts)


class ReasoningItem(Part):
    type: Literal["reasoning"]


def _item_type(item: Any) -> str | None:
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return f"item {kind}"


# Tags are not identifiers, so `error_param` leaves them out of the field path.
InputItem = Annotated[
    Annotated[MessageItem, Tag("item message")]
    | Annotated[FunctionCallItem, Tag("item function_call")]
    | Annotated[FunctionCallOutputItem, Tag("item function_call_output")]
    | Annotated[ReasoningItem, Tag("item reasoning")],
    Discriminator(
        _item_type,
        custom_error_type="invalid_item_type",
        custom_error_message=(
            "type must be message, function_call, function_call_output or reasoning"
        ),
    ),
]
Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
_ITEMS: TypeAdapter[list[Item]] = TypeAdapter(list[InputItem])


def items_of(values: Any) -> list[Item]:
    """Items in their JSON layout (a stored conversation's) as models."""
    return _ITEMS.validate_python(values)


class FunctionTool(Part):
    type: Literal["function"]  # hosted tools (web_search, file_search, ...): refused
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(Part):
    type: Literal["function"]
    name: str


ToolChoice = Literal["none", "auto", "required"] | NamedFunction


class TextFormat(Part):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Part):
    format: TextFormat | None = None
    verbosity: Any = None  # ignored


def _as_items(value: Any) -> Any:
    return (
        [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else value
    )


# OpenAI's `include` values. Only the logprobs change a reply here; the others name parts
# of items radixmesh never makes (hosted tools' results, images, encrypted reasoning).
LOGPROBS = "message.output_text.logprobs"
Includable = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
]


class InputTokensRequest(Body):
    """The fields that make a response's prompt: `POST /v1/responses/input_tokens`."""

    model: str | None = None
    input: list[InputItem] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    previous_response_id: str | None = None
    # Accepted and ignored: they do not change the prompt. `truncation: "auto"` asks to
    # drop old items past the context; none are dropped (a conversation past it is a 400).
    reasoning: Any = None
    truncation: Literal["auto", "disabled"] | None = None
    # Refused when set: no stored conversations.
    conversation: Any = None

    _items = field_validator("input", mode="before", json_schema_input_type=str | list[InputItem])(
        _as_items
    )


class ResponsesRequest(InputTokensRequest):
    model: str
    input: list[InputItem]
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = sampling_field("temperature", "temperature", OPENAI_RANGES)
    top_p: float | None = sampling_field("top_p", "top_p", OPENAI_RANGES)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    include: list[Includable] | None = None
    speculative: bool | None = Field(None, description=FIELD_DOCS["speculative"])  # ours
    store: bool | None = None
    stream: bool | None = None
    # Accepted and ignored: they do not change the output.
    metadata: dict[str, str] | None = None
    user: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    stream_options: Any = None
    # Refused when set: no background runs or prompt templates.
    background: bool | None = None
    prompt: Any = None

    @property
    def logprobs(self) -> bool:
        """The output text's logprobs are asked for (`include`, or `top_logprobs` alone)."""
        return self.top_logprobs is not None or LOGPROBS in (self.include or ())
