"""RequestOutput: what one scheduler step produced for one request (no torch here: it
crosses into the worker's server process, which does not load the engine's modules)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixmesh.errors import RequestAborted


@dataclass
class RequestOutput:
    """What one step produced for one request (deltas), handed to the request's sink."""

    rid: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    meta_info: dict[str, Any]
    # Logprob deltas (SGLang's shape): (logprob, token_id, None) per new token.
    new_token_logprobs: list[tuple[float, int, None]] = field(default_factory=list)
    new_top_logprobs: list[list[tuple[float, int, None]]] = field(default_factory=list)
    error: str | None = None
    embedding: list[float] | None = None  # an embedding request's, when it finished

    def then(self, later: RequestOutput) -> RequestOutput:
        """This output and the request's next one as one: deltas joined, the later state."""
        return RequestOutput(
            rid=later.rid,
            new_token_ids=self.new_token_ids + later.new_token_ids,
            text_delta=self.text_delta + later.text_delta,
            finished=later.finished,
            meta_info=later.meta_info,
            new_token_logprobs=self.new_token_logprobs + later.new_token_logprobs,
            new_top_logprobs=self.new_top_logprobs + later.new_top_logprobs,
            error=later.error,
            embedding=later.embedding,
        )

    def as_chunk(self) -> dict[str, Any]:
        """SGLang's streamed chunk: "text" and "output_ids" are deltas."""
        chunk: dict[str, Any] = {
            "text": self.text_delta,
            "output_ids": self.new_token_ids,
            "meta_info": self.meta_info,
        }
        if self.new_token_logprobs:
            chunk["output_token_logprobs"] = self.new_token_logprobs
        if self.new_top_logprobs:
            chunk["output_top_logprobs"] = self.new_top_logprobs
        if self.embedding is not None:
            chunk["embedding"] = self.embedding
        return chunk


def embedding_result(result: dict[str, Any]) -> dict[str, Any]:
    """An embedding request's final chunk (or whole result) as {"embedding", "meta_info"};
    one that ended without its vector (aborted) raises RequestAborted with the reason."""
    if "embedding" not in result:
        reason = result["meta_info"].get("finish_reason") or {}
        raise RequestAborted(reason.get("message") or "the embedding request was aborted")
    return {"embedding": result["embedding"], "meta_info": result["meta_info"]}
