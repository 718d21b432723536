"""The scoring routes' bodies and replies, in SGLang's, vLLM's and Cohere's shapes.

Parsing and reply shapes only; score_api.py scores. Every body becomes one of two
requests, so that the scoring path is one:

- `LabelScoreRequest`: SGLang's `/v1/score` (the probabilities of label tokens after
  `query + item`);
- `RelevanceRequest`: query-document pairs, each judged by the model's yes / no
  (`rerank_prompt`). Every rerank shape is one query against its documents; vLLM's
  `/score` pairs `text_1` with `text_2` (or `queries` with `documents` or `items`,
  `data_1` with `data_2`): 1 to 1, 1 to N, or N to N, as vLLM pairs them.

Documents are strings, or `{"text": ...}` objects (Cohere's and Jina's form); anything
else is a 400 saying the model takes text only. `model` is accepted everywhere and
checked by the route against the served model. Unknown fields are a 400 naming them.
Errors: InvalidArgument naming the field, rendered in the router's `{"error": {...}}`.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixmesh.errors import InvalidArgument

MAX_ITEMS = 64
MAX_LABELS = 32
RERANK_ANSWERS = (" yes", " no")
RERANK_TASK = "Judge whether the document is relevant to the query."

_LABEL_FIELDS = frozenset(
    {
        "query", "items", "label_token_ids", "apply_softmax", "temperature",
        "return_token_logprobs", "item_first", "model",
    }
)  # fmt: skip
# SGLang's, for classification heads and embeddings input: accepted when null / false.
_LABEL_UNSERVED = frozenset(
    {
        "embed_override_token_id", "query_embed_overrides", "item_embed_overrides",
        "return_pooled_hidden_states", "score_extraction_token",
    }
)  # fmt: skip
# vLLM's names for the two sides of its pairs, in the order they are looked for.
PAIR_KEYS = (
    ("text_1", "text_2"),
    ("data_1", "data_2"),
    ("queries", "documents"),
    ("queries", "items"),
)
# The names only vLLM's body has (SGLang's has `query`, `items`, `label_token_ids`).
_PAIR_ONLY = frozenset({"text_1", "text_2", "data_1", "data_2", "queries", "documents"})


def rerank_prompt(query: str, document: str, instruct: str | None) -> str:
    """The yes / no question whose answer scores `document` against `query`."""
    task = instruct or RERANK_TASK
    return (
        f"{task} Answer only yes or no.\n"
        f"Query: {query}\nDocument: {document}\nRelevant (yes or no):"
    )


# ---- relevance: every rerank shape and vLLM's score ---------------------------------------


@dataclass(frozen=True)
class RelevanceRequest:
    """Query-document pairs, each judged alone. `fields[i]`: the field named when pair
    i's prompt does not fit the context. `top_n`: how many of the best a rerank returns
    (None: all)."""

    queries: list[str]
    documents: list[str]
    fields: list[str]
    instruct: str | None
    model: str | None
    top_n: int | None = None
    return_documents: bool = True

    def prompts(self) -> list[str]:
        return [
            rerank_prompt(q, d, self.instruct)
            for q, d in zip(self.queries, self.documents, strict=True)
        ]


def parse_rerank(body: Any, *, sglang: bool) -> RelevanceRequest:
    """A rerank body: `query`, `documents`, `top_n`, `return_documents`, `model`, and the
    task as SGLang's `instruct` (`sglang`) or vLLM's `instruction`. SGLang's `top_n` is at
    least 1; vLLM's 0 (its default) means all."""
    task = "instruct" if sglang else "instruction"
    _check_names(body, {"query", "documents", "top_n", "return_documents", "model", task})
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise InvalidArgument("query", "give a non-empty string (the served model takes text only)")
    documents = _documents(body.get("documents"), "documents")
    top_n = body.get("top_n")
    least = 1 if sglang else 0
    if top_n is not None and (
        isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < least
    ):
        raise InvalidArgument("top_n", f"must be an integer >= {least}, got {top_n!r:.32}")
    return RelevanceRequest(
        queries=[query] * len(documents),
        documents=documents,
        fields=[f"documents[{i}]" for i in range(len(documents))],
        instruct=_optional_str(body, task),
        model=_model(body),
        top_n=top_n or None,
        return_documents=_bool(body, "return_documents", True),
    )


def is_pair_score(body: Any) -> bool:
    """Whether a `/v1/score` body is vLLM's (pairs) rather than SGLang's (labels)."""
    return isinstance(body, dict) and any(name in body for name in _PAIR_ONLY)


def parse_pair_score(body: Any) -> RelevanceRequest:
    """vLLM's score body: its two sides paired 1 to 1, 1 to N or N to N."""
    if not isinstance(body, dict):
        raise InvalidArgument("body", "the request body must be a JSON object")
    keys = next((k for k in PAIR_KEYS if k[0] in body and k[1] in body), None)
    if keys is None:
        raise InvalidArgument(
            "text_1",
            "give text_1 and text_2 (or queries and documents, queries and items, "
            "data_1 and data_2)",
        )
    first, second = keys
    _check_names(body, {first, second, "model", "instruction"})
    queries = _side(body[first], first)
    documents = _side(body[second], second)
    if len(queries) == 1:
        queries = queries * len(documents)
    elif len(queries) != len(documents):
        raise InvalidArgument(
            second,
            f"{len(queries)} {first} for {len(documents)} {second}: pair 1 to 1, 1 to N or N to N",
        )
    if not all(queries):
        raise InvalidArgument(first, "give non-empty strings")
    many = isinstance(body[second], list)
    return RelevanceRequest(
        queries=queries,
        documents=documents,
        fields=[f"{second}[{i}]" if many else second for i in range(len(documents))],
        instruct=_optional_str(body, "instruction"),
        model=_model(body),
    )


def _side(value: Any, name: str) -> list[str]:
    """One side of vLLM's pairs: a text, or a list of them."""
    if isinstance(value, list):
        return _documents(value, name)
    return [_text(value, name)]


def _documents(value: Any, name: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise InvalidArgument(name, "give a non-empty list of strings")
    if len(value) > MAX_ITEMS:
        raise InvalidArgument(name, f"at most {MAX_ITEMS} texts, got {len(value)}")
    return [_text(d, f"{name}[{i}]") for i, d in enumerate(value)]


def _text(value: Any, name: str) -> str:
    if isinstance(value, dict) and set(value) == {"text"}:
        value = value["text"]
    if not isinstance(value, str):
        raise InvalidArgument(
            name, 'expected a string or {"text": string}: the served model takes text only'
        )
    return value


def sglang_rerank_reply(req: RelevanceRequest, scores: list[float]) -> list[dict[str, Any]]:
    """SGLang's list of `{"score", "document"?, "index"}`, best first, at most `top_n`."""
    out = []
    for i in _ranked(scores, req.top_n):
        entry: dict[str, Any] = {"score": scores[i], "index": i}
        if req.return_documents:
            entry["document"] = req.documents[i]
        out.append(entry)
    return out


def rerank_reply(
    req: RelevanceRequest, scores: list[float], model: str, prompt_tokens: int
) -> dict[str, Any]:
    """vLLM's and Cohere's: `results` of `{"index", "relevance_score", "document"?:
    {"text"}}`, best first, at most `top_n`."""
    results = []
    for i in _ranked(scores, req.top_n):
        entry: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if req.return_documents:
            entry["document"] = {"text": req.documents[i]}
        results.append(entry)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        "results": results,
    }


def pair_score_reply(scores: list[float], model: str, prompt_tokens: int) -> dict[str, Any]:
    """vLLM's: `data` of `{"index", "object": "score", "score"}` in pair order."""
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": usage(prompt_tokens),
    }


def _ranked(scores: list[float], top_n: int | None) -> list[int]:
    """Indices best first (ties by index), at most `top_n`."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order[:top_n] if top_n is not None else order


def relevance(yes: float, no: float) -> float:
    """P(" yes") / (P(" yes") + P(" no")) from the two answers' logprobs."""
    return softmax([yes, no], 1.0)[0]


# ---- SGLang's label scores ----------------------------------------------------------------


class LabelScoreRequest:
    def __init__(self, body: dict[str, Any], vocab_size: int) -> None:
        self.query: str | list[int] = _query(body.get("query"))
        self.items: list[Any] = _items(body.get("items"), self.query)
        self.labels = _labels(body.get("label_token_ids"), len(self.items), vocab_size)
        self.apply_softmax = _bool(body, "apply_softmax", False)
        self.return_token_logprobs = _bool(body, "return_token_logprobs", False)
        self.item_first = _bool(body, "item_first", False)
        temperature = body.get("temperature", 1.0)
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not math.isfinite(temperature)
            or temperature <= 0
        ):
            raise InvalidArgument("temperature", f"must be a number > 0, got {temperature!r:.64}")
        self.temperature = float(temperature)
        self.model = _model(body)

    def probabilities(self, logprobs: Sequence[float]) -> list[float]:
        """exp(logprob), or a softmax over the labels divided by `temperature`."""
        if self.apply_softmax:
            return softmax(logprobs, self.temperature)
        return [math.exp(lp) for lp in logprobs]


def parse_label_score(body: Any, vocab_size: int) -> LabelScoreRequest:
    if not isinstance(body, dict):
        raise InvalidArgument("body", "the request body must be a JSON object")
    for name, value in body.items():
        if name in _LABEL_UNSERVED:
            if value not in (None, False, [], ""):
                raise InvalidArgument(name, f"{name} is not served (a causal LM scores by labels)")
        elif name not in _LABEL_FIELDS:
            raise InvalidArgument(str(name)[:64], f"unknown field {str(name)[:64]!r}")
    return LabelScoreRequest(body, vocab_size)


def _query(query: Any) -> str | list[int]:
    if isinstance(query, str) and query:
        return query
    if isinstance(query, list) and query and all(_is_id(t) for t in query):
        return list(query)
    raise InvalidArgument("query", "give a non-empty string or a list of token ids")


def _items(items: Any, query: str | list[int]) -> list[Any]:
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not items:
        raise InvalidArgument("items", "give a string, a list of strings or of token id lists")
    if len(items) > MAX_ITEMS:
        raise InvalidArgument("items", f"at most {MAX_ITEMS} items, got {len(items)}")
    text = isinstance(query, str)
    for i, item in enumerate(items):
        ok = (
            isinstance(item, str)
            if text
            else isinstance(item, list) and all(_is_id(t) for t in item)
        )
        if not ok:
            kind = "a string (the query is text)" if text else "a list of token ids (as the query)"
            raise InvalidArgument(f"items[{i}]", f"expected {kind}")
    return list(items)


def _labels(raw: Any, count: int, vocab_size: int) -> list[list[int]]:
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument("label_token_ids", "give a non-empty list of token ids")
    per_item = all(isinstance(x, list) for x in raw)
    lists = raw if per_item else [raw] * count
    if per_item and len(raw) != count:
        raise InvalidArgument("label_token_ids", f"{len(raw)} label lists for {count} items")
    for labels in lists:
        if not labels or len(labels) > MAX_LABELS:
            raise InvalidArgument("label_token_ids", f"give 1 to {MAX_LABELS} labels per item")
        for t in labels:
            if not _is_id(t) or t >= vocab_size:
                raise InvalidArgument(
                    "label_token_ids", f"{t!r:.32} is not a token id in [0, {vocab_size})"
                )
    return [list(x) for x in lists]


# ---- shared -------------------------------------------------------------------------------


def _check_names(body: Any, known: set[str]) -> None:
    if not isinstance(body, dict):
        raise InvalidArgument("body", "the request body must be a JSON object")
    for name in body:
        if name not in known:
            raise InvalidArgument(str(name)[:64], f"unknown field {str(name)[:64]!r}")


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidArgument("model", "must be a string")
    return model


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(name, "must be a string")
    return value or None


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidArgument(name, f"must be true or false, got {value!r:.32}")
    return value


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def softmax(logprobs: Sequence[float], temperature: float) -> list[float]:
    top = max(logprobs)  # centred first: a small temperature must not overflow
    weights = [math.exp((lp - top) / temperature) for lp in logprobs]
    total = sum(weights)
    return [w / total for w in weights]


def usage(prompt_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
