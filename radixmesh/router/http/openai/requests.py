"""OpenAI's request bodies as pydantic models: field names, types and shapes.

The ranges of sampling fields are checked once, by `SamplingParams` (the schema the worker
validates with), so a bad value reads the same over HTTP and gRPC; these models check what
only the OpenAI API has (`n`, `logprobs`, message and tool shapes). Types are strict: a
string is not a number and 1 is not `true`.

Unknown top-level fields are kept in `model_extra` for the conversion layer to refuse by
name (the router's default, as OpenAI's API does) or, with `--no-strict-openai`, to log
and drop; unknown keys inside nested objects are ignored, except in `structured_outputs`,
whose every key changes the output. Fields OpenAI defines that radixmesh accepts and
ignores are declared (`user`, `metadata`, ...), so they are not "unknown"; fields that
would change the output and cannot be honoured are declared too, for the conversion
layer to refuse by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from radixmesh.router.http.sampling_fields import OPENAI_RANGES, with_sampling_fields

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_EMBEDDING_INPUTS = 2048


class Body(BaseModel):
    """A request body: unknown top-level fields are kept for the caller to judge."""

    model_config = ConfigDict(extra="allow", strict=True)


class Part(BaseModel):
    """An object inside a body: unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


# ---- messages -----------------------------------------------------------------------------


class TextPart(Part):
    type: Literal["text"]
    text: str


_UNREADABLE = ("image_url", "input_audio", "file")


class UnreadablePart(Part):
    """A part the served model cannot read (OpenAI's image, audio and file parts):
    declared so that it is refused naming the part and why, not as "not a string"."""

    type: Literal["image_url", "input_audio", "file"]

    @model_validator(mode="after")
    def _refuse(self) -> UnreadablePart:
        raise PydanticCustomError(
            "unsupported_content",
            "{kind} content parts are not supported: the served model takes text only",
            {"kind": self.type},
        )


def _part_type(part: Any) -> str:
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    return "part unreadable" if kind in _UNREADABLE else f"part {kind}"


def _content_kind(content: Any) -> str:
    return "content text" if isinstance(content, str) else "content parts"


# Tags are not identifiers, so `error_param` leaves them out of the field path.
ContentPart = Annotated[
    Annotated[TextPart, Tag("part text")] | Annotated[UnreadablePart, Tag("part unreadable")],
    Discriminator(
        _part_type,
        custom_error_type="invalid_part_type",
        custom_error_message="type must be text (the served model takes text only)",
    ),
]
# A string or a list of parts, told apart before either is validated: an error inside a
# list names its part (`messages[0].content[1]`), not "not a string" for the whole list.
Content = Annotated[
    Annotated[str, Tag("content text")] | Annotated[list[ContentPart], Tag("content parts")],
    Discriminator(_content_kind),
]


def text_of(content: Content | None) -> str:
    """A message's text: the string, or its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, TextPart))


class FunctionCall(Part):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(Part):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(Part):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None


class UserMessage(Part):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(Part):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    name: str | None = None


class ToolMessage(Part):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


def _role(message: Any) -> str | None:
    role = message.get("role") if isinstance(message, dict) else getattr(message, "role", None)
    return "role system" if role == "developer" else f"role {role}"


# Tags are not identifiers, so `error_param` leaves them out of the field path.
Message = Annotated[
    Annotated[SystemMessage, Tag("role system")]
    | Annotated[UserMessage, Tag("role user")]
    | Annotated[AssistantMessage, Tag("role assistant")]
    | Annotated[ToolMessage, Tag("role tool")],
    Discriminator(
        _role,
        custom_error_type="invalid_role",
        custom_error_message="role must be system, developer, user, assistant or tool",
    ),
]

# ---- tools and formats --------------------------------------------------------------------


class FunctionDefinition(Part):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Part):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Part):
    name: str


class NamedToolChoice(Part):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(Part):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(Part):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: dict[str, Any] | None = None  # type structural_tag: xgrammar's structural tag


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` object: one constraint (`json`, `regex`, `choice`,
    `grammar`, `json_object`, `structural_tag`) and options on how JSON is laid out.
    Unknown keys are refused: each would change the output."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None  # xgrammar's structural tag as JSON text
    disable_additional_properties: bool | None = None
    # The grammar's JSON layout is fixed (no free whitespace): what these ask for, or a
    # subset of it; `whitespace_pattern` is refused.
    disable_any_whitespace: bool | None = None
    whitespace_pattern: str | None = None
    disable_fallback: bool | None = None  # accepted: there is no fallback backend


class StreamOptions(Part):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # usage on every chunk (vLLM's extension)


# ---- generation ---------------------------------------------------------------------------


# OpenAI name -> SamplingParams name, for the fields that map one to one: their types and
# descriptions come from SamplingParams (router/http/sampling_fields.py).
PARAMS = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "stop": "stop",
    "stop_regex": "stop_regex",
    "stop_token_ids": "stop_token_ids",
    "seed": "seed",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
    "regex": "regex",
    "ebnf": "ebnf",
    "json_schema": "json_schema",
    "logit_bias": "logit_bias",
    "speculative": "speculative",
}


class SamplingBase(Body):
    """The fields completions and chat completions share, besides PARAMS'."""

    model: str
    n: int | None = Field(None, ge=1, le=MAX_N)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_completion_tokens: int | None = Field(None, ge=0)
    # Output constraints, at most one (constraints.py): OpenAI's, then vLLM's (SGLang's
    # `regex`, `ebnf`, `json_schema` are PARAMS').
    response_format: ResponseFormat | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_whitespace_pattern: str | None = None  # refused when set
    guided_decoding_backend: str | None = None  # ignored: the worker's backend compiles
    # Accepted and ignored: they do not change the output (the prompt cache keeps every
    # prefix it can, whatever a request asks).
    user: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    safety_identifier: Any = None


if TYPE_CHECKING:  # the checker sees the base; PARAMS' fields are read by name
    Sampling = SamplingBase
else:
    Sampling = with_sampling_fields(SamplingBase, PARAMS, "Sampling", OPENAI_RANGES)


PromptItem = str | list[int]


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[PromptItem]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = None
    best_of: int | None = None  # only == n (refused otherwise)
    suffix: str | None = None  # refused when not empty


class ChatCompletionRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    separate_reasoning: bool | None = None  # `<think>...</think>` -> reasoning_content
    # Extra variables of the model's chat template (vLLM's and SGLang's field), e.g.
    # {"enable_thinking": false} for Qwen3; radixmesh/tokenizer.py checks them.
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Any = None  # ignored
    # Only OpenAI's default, "medium": the model's own length (no control of it here).
    verbosity: str | None = None
    # Refused: radixmesh cannot produce audio, predicted outputs, web search or
    # moderation, or the deprecated `functions` (use `tools`).
    audio: Any = None
    moderation: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None


# ---- other endpoints ----------------------------------------------------------------------


class EmbeddingRequest(Body):
    model: str
    input: str | list[int] | list[str] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = None  # only the model's hidden size (refused otherwise)
    user: Any = None
    # radixmesh's extensions: how hidden states become one vector.
    pooling: Literal["mean", "last"] | None = None
    normalize: bool | None = None


class TokenizeRequest(Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: list[int]
    skip_special_tokens: bool | None = None
