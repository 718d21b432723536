"""OpenAI's response bodies as pydantic models, in the layout the `openai` client reads.

Replies are built from these models and written with `dump`, which leaves out the
optional fields (default None) nobody set: a chat message without tool calls has no
`tool_calls` key. Required fields are always written, even when null (`logprobs`,
`finish_reason`), and so are fields with a default (`object`, `type`).
`finish_reason` may also be "abort" (a worker aborted the request), which OpenAI's own
types do not list.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

FinishReason = Literal["stop", "length", "tool_calls", "abort"]


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def model_post_init(self, context: Any) -> None:
        fields = type(self).model_fields
        self.model_fields_set.update(n for n, f in fields.items() if f.default is not None)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


class PromptTokensDetails(Reply):
    cached_tokens: int


class Usage(Reply):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


# ---- logprobs -----------------------------------------------------------------------------


class TopLogprob(Reply):
    token: str
    logprob: float | None
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Reply):
    content: list[TokenLogprob] | None


class CompletionLogprobs(Reply):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float | None] | None]
    text_offset: list[int]


# ---- completions --------------------------------------------------------------------------


class CompletionChoice(Reply):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class Completion(Reply):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# ---- chat ---------------------------------------------------------------------------------


class FunctionCall(Reply):
    name: str
    arguments: str


class ToolCall(Reply):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Reply):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None


class ChatChoice(Reply):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletion(Reply):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class FunctionCallDelta(Reply):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Reply):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class Delta(Reply):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(Reply):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(Reply):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


# ---- other endpoints ----------------------------------------------------------------------


class Model(Reply):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str  # where the weights come from (a hub id, a path): router/http/model_identity.py
    max_model_len: int


class ModelList(Reply):
    object: Literal["list"] = "list"
    data: list[Model]


class Embedding(Reply):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64 of little-endian float32 with encoding_format base64


class EmbeddingUsage(Reply):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Reply):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class TokenizeResponse(Reply):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str | None] | None = None


class DetokenizeResponse(Reply):
    prompt: str


class ErrorBody(Reply):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Reply):
    error: ErrorBody
