"""Scoring and reranking on the router, in SGLang's, vLLM's and Cohere's shapes, over the
workers' Score RPC.

Every route asks the worker for the logprobs of continuations of a prompt (the path
`select` uses: `Dispatcher.score`), one Score call per item or pair, all at once
(`_score_all`). Bodies and replies are score_protocol.py's.

- `POST /v1/score` with SGLang's body (`query`, `items`, `label_token_ids`): for each
  item the prompt is `query + item` (`item + query` with `item_first`), text joined as
  text or token ids as ids, and the item's scores are the probabilities of each label as
  the next token. Reply: `{"scores", "token_logprobs"?, "model", "usage", "object":
  "scoring"}`.
- Relevance (`_relevance`), for every other route: a causal LM is no cross-encoder, so a
  document's relevance is the model's answer to a yes / no question about it, as
  Qwen3-Reranker scores: `P(" yes") / (P(" yes") + P(" no"))` after `rerank_prompt`.
  - `POST|PUT /v1/rerank`: SGLang's; its list of `{"score", "document"?, "index"}`.
  - `POST /rerank`, `/v2/rerank`: vLLM's and Cohere's; `{"id", "model", "usage",
    "results": [{"index", "relevance_score", "document"?: {"text"}}]}`.
  - `POST /score`, and `/v1/score` with vLLM's body (`text_1` / `text_2`, ...): vLLM's
    pair scores, `{"id", "object": "list", "created", "model", "data": [{"index",
    "object": "score", "score"}], "usage"}`.

`/v1/rerank` is SGLang's, whose body a vLLM or Cohere client sends unchanged (`model`
included) but whose reply differs: SGLang's frontend and documented examples read its
list, so a vLLM or Cohere client points at `/rerank` or `/v2/rerank` (Cohere's v2
client's own path). `/v1/score` tells SGLang's and vLLM's bodies apart by their field
names, which do not overlap.

`model` is checked against the served model (404 naming `model` otherwise, as every
route). Limits: at most MAX_ITEMS items, documents or pairs, MAX_LABELS labels per item;
each prompt within the model's context (400 naming the item). Errors: the HTTP front
end's `{"error": {...}}`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from radixmesh.errors import InvalidArgument
from radixmesh.router.http import score_protocol as sp
from radixmesh.router.http.api_error import read_json
from radixmesh.router.limits import check_prompt_fits
from radixmesh.v1 import common_pb2, worker_pb2

if TYPE_CHECKING:
    from radixmesh.router.http.frontend import Frontend


class ScoreApi:
    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend

    def register(self, app: web.Application) -> None:
        app.router.add_post("/v1/score", self.v1_score)
        app.router.add_post("/score", self.pair_score)
        app.router.add_route("POST", "/v1/rerank", self.sglang_rerank)
        app.router.add_route("PUT", "/v1/rerank", self.sglang_rerank)
        for path in ("/rerank", "/v2/rerank"):
            app.router.add_post(path, self.rerank)

    async def _body(self, request: web.Request) -> Any:
        info = self.frontend.ready()[1]
        return await read_json(request, self.frontend.config.limits, info.context_length)

    def _check_model(self, model: str | None) -> str:
        """The served model's name, after checking the one the request names."""
        if model is not None:
            self.frontend.check_model(model)
        return self.frontend.ready()[1].model

    # ---- the routes -----------------------------------------------------------------------

    async def v1_score(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if sp.is_pair_score(body):
            return await self._pair_score(body)
        req = sp.parse_label_score(body, self.frontend.ready()[1].vocab_size)
        model = self._check_model(req.model)
        prompts = await self._label_prompts(req)
        labels = [
            [worker_pb2.Continuation(token_ids=common_pb2.TokenIds(ids=[t])) for t in ls]
            for ls in req.labels
        ]
        resps = await self._score_all(prompts, labels)
        logprobs = [[s.sum_logprob for s in resp.scores] for resp in resps]
        out: dict[str, Any] = {
            "scores": [req.probabilities(lps) for lps in logprobs],
            "model": model,
            "usage": sp.usage(sum(len(p) for p in prompts)),
            "object": "scoring",
        }
        if req.return_token_logprobs:
            out["token_logprobs"] = logprobs
        return web.json_response(out)

    async def pair_score(self, request: web.Request) -> web.Response:
        return await self._pair_score(await self._body(request))

    async def _pair_score(self, body: Any) -> web.Response:
        req = sp.parse_pair_score(body)
        model = self._check_model(req.model)
        scores, tokens = await self._relevance(req)
        return web.json_response(sp.pair_score_reply(scores, model, tokens))

    async def sglang_rerank(self, request: web.Request) -> web.Response:
        req = sp.parse_rerank(await self._body(request), sglang=True)
        self._check_model(req.model)
        scores, _ = await self._relevance(req)
        return web.json_response(sp.sglang_rerank_reply(req, scores))

    async def rerank(self, request: web.Request) -> web.Response:
        req = sp.parse_rerank(await self._body(request), sglang=False)
        model = self._check_model(req.model)
        scores, tokens = await self._relevance(req)
        return web.json_response(sp.rerank_reply(req, scores, model, tokens))

    # ---- the one scoring path -------------------------------------------------------------

    async def _relevance(self, req: sp.RelevanceRequest) -> tuple[list[float], int]:
        """Each pair's P(" yes") / (P(" yes") + P(" no")), and the prompts' tokens."""
        texts = req.prompts()
        prompts = [await self._encode(t, f) for t, f in zip(texts, req.fields, strict=True)]
        answers = [worker_pb2.Continuation(text=a) for a in sp.RERANK_ANSWERS]
        resps = await self._score_all(prompts, [answers] * len(prompts))
        scores = [sp.relevance(*(s.sum_logprob for s in resp.scores)) for resp in resps]
        return scores, sum(len(p) for p in prompts)

    async def _label_prompts(self, req: sp.LabelScoreRequest) -> list[list[int]]:
        prompts = []
        query = req.query
        for i, item in enumerate(req.items):
            name = f"items[{i}]"
            if isinstance(query, str):
                text = item + query if req.item_first else query + item
                prompts.append(await self._encode(text, name))
            else:
                ids = item + query if req.item_first else query + item
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
