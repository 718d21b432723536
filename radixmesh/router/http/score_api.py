"""SGLang's `/v1/score` and `/v1/rerank` on the router, over the workers' Score RPC.

Both ask the worker for the logprobs of continuations of a prompt (the path `select`
uses: `Dispatcher.score`), one Score call per item, the items' calls at once.

`POST /v1/score` (SGLang's ScoringRequest, for a causal LM): for each item the prompt is
`query + item` (`item + query` with `item_first`), text joined as text or token ids as
ids, and the item's scores are the probabilities of each of `label_token_ids` as the next
token: `exp(logprob)`, or a softmax over the labels' logprobs divided by `temperature`
with `apply_softmax`. `label_token_ids` is one list for every item or one list per item.
Reply: `{"scores": [[p, ...], ...], "token_logprobs"?, "model", "usage", "object":
"scoring"}`. SGLang's embedding overrides, pooled hidden states and setwise readout
(`score_extraction_token`) need a classification head or embeddings input: 400 naming
the field unless null / false.

`POST|PUT /v1/rerank` (SGLang's V1RerankReqInput): a causal LM is no cross-encoder, so a
document's relevance is the model's answer to a yes / no question about it, as
Qwen3-Reranker scores: `P(" yes") / (P(" yes") + P(" no"))` after the prompt built by
`rerank_prompt` (with `instruct` as the task when given). Reply: SGLang's list of
`{"score", "document"?, "index"}`, best first, at most `top_n`.

Limits: at most MAX_ITEMS items or documents and MAX_LABELS labels per item; each prompt
within the model's context (400 naming the field). Errors: the HTTP front end's
`{"error": {...}}`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from radixmesh.errors import InvalidArgument
from radixmesh.router.http.api_error import read_json
from radixmesh.router.limits import check_prompt_fits
from radixmesh.v1 import common_pb2, worker_pb2

if TYPE_CHECKING:
    from radixmesh.router.http.frontend import Frontend

MAX_ITEMS = 64
MAX_LABELS = 32
_SCORE_FIELDS = frozenset(
    {
        "query", "items", "label_token_ids", "apply_softmax", "temperature",
        "return_token_logprobs", "item_first", "model",
    }
)  # fmt: skip
# SGLang's, for classification heads and embeddings input: accepted when null / false.
_SCORE_UNSERVED = frozenset(
    {
        "embed_override_token_id", "query_embed_overrides", "item_embed_overrides",
        "return_pooled_hidden_states", "score_extraction_token",
    }
)  # fmt: skip
_RERANK_FIELDS = frozenset({"query", "documents", "instruct", "top_n", "return_documents"})
RERANK_ANSWERS = (" yes", " no")
RERANK_TASK = "Judge whether the document is relevant to the query."


def rerank_prompt(query: str, document: str, instruct: str | None) -> str:
    """The yes / no question whose answer scores `document` (see the module doc)."""
    task = instruct or RERANK_TASK
    return (
        f"{task} Answer only yes or no.\n"
        f"Query: {query}\nDocument: {document}\nRelevant (yes or no):"
    )


class ScoreApi:
    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend

    def register(self, app: web.Application) -> None:
        app.router.add_post("/v1/score", self.score)
        app.router.add_route("POST", "/v1/rerank", self.rerank)
        app.router.add_route("PUT", "/v1/rerank", self.rerank)

    async def score(self, request: web.Request) -> web.Response:
        _, info = self.frontend.ready()
        body = await read_json(request, self.frontend.config.limits, info.context_length)
        req = parse_score(body, info.vocab_size)
        if req.model is not None:
            self.frontend.check_model(req.model)
        prompts = await self._prompts(req.query, req.items, req.item_first, "items")
        labels = [
            [worker_pb2.Continuation(token_ids=common_pb2.TokenIds(ids=[t])) for t in ls]
            for ls in req.labels
        ]
        resps = await self._score_all(prompts, labels)
        scores, logprobs = [], []
        for resp in resps:
            lps = [s.sum_logprob for s in resp.scores]
            logprobs.append(lps)
            scores.append(_probabilities(lps, req.apply_softmax, req.temperature))
        prompt_tokens = sum(len(p) for p in prompts)
        out: dict[str, Any] = {
            "scores": scores,
            "model": info.model,
            "usage": _usage(prompt_tokens),
            "object": "scoring",
        }
        if req.return_token_logprobs:
            out["token_logprobs"] = logprobs
        return web.json_response(out)

    async def rerank(self, request: web.Request) -> web.Response:
        _, info = self.frontend.ready()
        body = await read_json(request, self.frontend.config.limits, info.context_length)
        query, documents, instruct, top_n, with_documents = parse_rerank(body)
        texts = [rerank_prompt(query, d, instruct) for d in documents]
        prompts = [await self._encode(t, f"documents[{i}]") for i, t in enumerate(texts)]
        answers = [worker_pb2.Continuation(text=a) for a in RERANK_ANSWERS]
        resps = await self._score_all(prompts, [answers] * len(prompts))
        results = []
        for i, resp in enumerate(resps):
            yes, no = (s.sum_logprob for s in resp.scores)
            entry: dict[str, Any] = {"score": _softmax([yes, no], 1.0)[0], "index": i}
            if with_documents:
                entry["document"] = documents[i]
            results.append(entry)
        results.sort(key=lambda r: (-r["score"], r["index"]))
        return web.json_response(results[:top_n])

    # ---- the prompts and the worker calls ------------------------------------------------

    async def _prompts(
        self, query: str | list[int], items: list[Any], item_first: bool, field: str
    ) -> list[list[int]]:
        prompts = []
        for i, item in enumerate(items):
            name = f"{field}[{i}]"
            if isinstance(query, str):
                text = item + query if item_first else query + item
                prompts.append(await self._encode(text, name))
            else:
                ids = item + query if item_first else query + item
                self._check_fits(len(ids), name)
                prompts.append(ids)
        return prompts

    async def _encode(self, text: str, field: str) -> list[int]:
        inp = common_pb2.Input(text=text)
        try:
            ids = await self.frontend.dispatch.input_ids(inp)
        except InvalidArgument as e:
            raise InvalidArgument(field, e.message) from None
        self._check_fits(len(ids), field)
        return ids

    def _check_fits(self, tokens: int, field: str) -> None:
        # The continuation's token comes after the prompt: room for one more.
        check_prompt_fits(field, tokens, self.frontend.ready()[1].context_length, 1)

    async def _score_all(
        self, prompts: list[list[int]], continuations: list[list[worker_pb2.Continuation]]
    ) -> list[worker_pb2.ScoreResponse]:
        dispatch = self.frontend.dispatch

        def call(ids: list[int], conts: list[worker_pb2.Continuation]) -> Any:
            inp = common_pb2.Input(token_ids=common_pb2.TokenIds(ids=ids))
            return dispatch.score(ids, worker_pb2.ScoreRequest(input=inp, continuations=conts))

        calls = [call(ids, conts) for ids, conts in zip(prompts, continuations, strict=True)]
        return list(await asyncio.gather(*calls))


# ---- parsing ------------------------------------------------------------------------------


class ScoreRequest:
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
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise InvalidArgument("model", "must be a string")
        self.model: str | None = model


def parse_score(body: Any, vocab_size: int) -> ScoreRequest:
    if not isinstance(body, dict):
        raise InvalidArgument("body", "the request body must be a JSON object")
    for name, value in body.items():
        if name in _SCORE_UNSERVED:
            if value not in (None, False, [], ""):
                raise InvalidArgument(name, f"{name} is not served (a causal LM scores by labels)")
        elif name not in _SCORE_FIELDS:
            raise InvalidArgument(str(name)[:64], f"unknown field {str(name)[:64]!r}")
    return ScoreRequest(body, vocab_size)


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


def parse_rerank(body: Any) -> tuple[str, list[str], str | None, int, bool]:
    """(query, documents, instruct, top_n, return_documents) of a `/v1/rerank` body."""
    if not isinstance(body, dict):
        raise InvalidArgument("body", "the request body must be a JSON object")
    for name in body:
        if name not in _RERANK_FIELDS:
            raise InvalidArgument(str(name)[:64], f"unknown field {str(name)[:64]!r}")
    query, documents = body.get("query"), body.get("documents")
    if not isinstance(query, str) or not query:
        raise InvalidArgument("query", "give a non-empty string (text only)")
    if not isinstance(documents, list) or not documents:
        raise InvalidArgument("documents", "give a non-empty list of strings")
    if len(documents) > MAX_ITEMS:
        raise InvalidArgument("documents", f"at most {MAX_ITEMS} documents, got {len(documents)}")
    for i, d in enumerate(documents):
        if not isinstance(d, str):
            raise InvalidArgument(f"documents[{i}]", "expected a string (text only)")
    instruct = body.get("instruct")
    if instruct is not None and not isinstance(instruct, str):
        raise InvalidArgument("instruct", "must be a string")
    top_n = body.get("top_n")
    if top_n is None:
        top_n = len(documents)
    elif isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise InvalidArgument("top_n", f"must be an integer >= 1, got {top_n!r:.32}")
    return query, list(documents), instruct or None, top_n, _bool(body, "return_documents", True)


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidArgument(name, f"must be true or false, got {value!r:.32}")
    return value


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


# ---- scores -------------------------------------------------------------------------------


def _probabilities(logprobs: Sequence[float], softmax: bool, temperature: float) -> list[float]:
    if softmax:
        return _softmax(logprobs, temperature)
    return [math.exp(lp) for lp in logprobs]


def _softmax(logprobs: Sequence[float], temperature: float) -> list[float]:
    top = max(logprobs)  # centred first: a small temperature must not overflow
    weights = [math.exp((lp - top) / temperature) for lp in logprobs]
    total = sum(weights)
    return [w / total for w in weights]


def _usage(prompt_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
