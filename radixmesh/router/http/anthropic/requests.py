"""Anthropic's Messages request body as pydantic models: field names, types and shapes.

Types are strict, as OpenAI's models are (openai/requests.py): a string is not a number.
A message's `content` may be a string, which is read as one text block, so every error
inside content names a block (`messages[1].content[0].text`) instead of pydantic's "not
a string" for a list that holds one bad block. Unknown top-level fields are kept in
`model_extra` for the conversion to log (or refuse under `--strict-openai`); unknown keys
inside blocks are ignored (`cache_control`, `citations`: hints that change no output).

Blocks the served model cannot read (`image`, `document`) are declared, so that the
conversion refuses them by name with a reason rather than as an unknown tag. `thinking`
and `redacted_thinking` blocks, which clients send back from earlier turns, are declared
and dropped: radixmesh produces none, and they are not part of the prompt.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator

from radixmesh.router.http.openai.requests import Body, Part
from radixmesh.router.http.sampling_fields import ANTHROPIC_RANGES, sampling_field
from radixmesh.sampling_params import FIELD_DOCS

# Anthropic's tool names: ^[a-zA-Z0-9_-]{1,128}$; held to the chat API's 64 characters
# (the same tool machinery serves both).
TOOL_NAME = r"^[A-Za-z0-9_\-]{1,64}$"


class TextBlock(Part):
    type: Literal["text"]
    text: str


class ImageBlock(Part):
    type: Literal["image"]
    source: Any = None


class DocumentBlock(Part):
    type: Literal["document"]
    source: Any = None


class ThinkingBlock(Part):
    type: Literal["thinking", "redacted_thinking"]


class ToolUseBlock(Part):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(pattern=TOOL_NAME)
    input: dict[str, Any]


def _block_type(block: Any) -> str:
    kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
    return "block thinking" if kind == "redacted_thinking" else f"block {kind}"


def _discriminator(kinds: str) -> Discriminator:
    return Discriminator(
        _block_type,
        custom_error_type="invalid_block_type",
        custom_error_message=f"type must be one of {kinds}",
    )


# Tags are not identifiers, so `error_param` leaves them out of the field path.
ResultPart = Annotated[
    Annotated[TextBlock, Tag("block text")]
    | Annotated[ImageBlock, Tag("block image")]
    | Annotated[DocumentBlock, Tag("block document")],
    _discriminator("text, image, document"),
]


class ToolResultBlock(Part):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ResultPart] | None = None
    is_error: bool | None = None


Block = Annotated[
    Annotated[TextBlock, Tag("block text")]
    | Annotated[ImageBlock, Tag("block image")]
    | Annotated[DocumentBlock, Tag("block document")]
    | Annotated[ThinkingBlock, Tag("block thinking")]
    | Annotated[ToolUseBlock, Tag("block tool_use")]
    | Annotated[ToolResultBlock, Tag("block tool_result")],
    _discriminator("text, image, document, tool_use, tool_result, thinking, redacted_thinking"),
]


def as_blocks(value: Any) -> Any:
    """A string content is one text block."""
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class Message(Part):
    role: Literal["user", "assistant"]
    content: list[Block]

    _blocks = field_validator("content", mode="before", json_schema_input_type=str | list[Block])(
        as_blocks
    )


class Tool(Part):
    # Server tools (`web_search_20250305`, ...) carry a type, refused here first (they have
    # no input_schema); custom tools have none or "custom".
    type: Literal["custom"] | None = None
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(Part):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class JsonFormat(Part):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Part):
    format: JsonFormat | None = None  # structured output: the grammar engine holds to it
    effort: Any = None  # ignored


class MessagesRequest(Body):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = sampling_field("temperature", "temperature", ANTHROPIC_RANGES)
    top_p: float | None = sampling_field("top_p", "top_p", ANTHROPIC_RANGES)
    top_k: int | None = Field(None, description=FIELD_DOCS["top_k"])
    speculative: bool | None = Field(None, description=FIELD_DOCS["speculative"])  # ours
    stream: bool | None = None
    output_config: OutputConfig | None = None
    # Accepted and ignored: they do not change the output (no thinking blocks are made:
    # a budget is an upper bound, and none is within it; the radix cache keeps prefixes
    # without `cache_control`).
    metadata: Any = None
    service_tier: Any = None
    thinking: Any = None
    cache_control: Any = None
    inference_geo: Any = None
    speed: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None
    diagnostics: Any = None
    # Refused when set: radixmesh runs no server-side tools or containers.
    mcp_servers: Any = None
    container: Any = None


class CountTokensRequest(Body):
    """`POST /v1/messages/count_tokens`: the prompt's fields of a messages request."""

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Any = None
    output_config: Any = None
    cache_control: Any = None
