"""`POST /v1/embeddings`: the served model's pooled final hidden states.

Each input is one Embed request through the router (routed like a generation: to the
worker caching most of it), at most `MAX_CONCURRENT` at a time per HTTP request. The
vector is the prompt's final hidden states (after the model's last norm) pooled over its
positions (`pooling: "mean"`, the default) or taken at its last position (`"last"`),
then scaled to unit length unless `normalize: false`. A chat model's hidden states are
not trained as embeddings: they are what the model computes, no more.
"""

from __future__ import annotations

import asyncio
import base64
import math
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from radixmesh.router.http.openai import requests as rq
from radixmesh.router.http.openai import responses as rs
from radixmesh.router.http.openai.convert import refuse, token_ids, validate
from radixmesh.tokenizer import TokenizerLike
from radixmesh.v1 import common_pb2

MAX_CONCURRENT = 64  # Embed calls in flight per HTTP request
_POOLING = {"mean": common_pb2.POOLING_MEAN, "last": common_pb2.POOLING_LAST}

Embed = Callable[[list[int], common_pb2.Pooling, str], Awaitable[tuple[str, common_pb2.Embedding]]]


@dataclass(frozen=True)
class EmbeddingJob:
    model: str
    inputs: list[list[int]]  # token ids per input
    pooling: common_pb2.Pooling
    normalize: bool
    base64: bool


def parse_embeddings(
    body: Any,
    *,
    tokenizer: TokenizerLike,
    context_length: int,
    hidden_size: int,
    strict: bool = False,
) -> EmbeddingJob:
    req = validate(rq.EmbeddingRequest, body, strict=strict)
    if req.dimensions is not None and req.dimensions != hidden_size:
        refuse("dimensions", f"only the model's hidden size, {hidden_size}")
    raw = req.input
    items: list[str | list[int]]
    if isinstance(raw, str) or (raw and all(isinstance(t, int) for t in raw)):
        items = [raw]  # type: ignore[list-item]
    else:
        items = list(raw)  # type: ignore[arg-type]
    if not items or len(items) > rq.MAX_EMBEDDING_INPUTS:
        refuse("input", f"give 1 to {rq.MAX_EMBEDDING_INPUTS} inputs, got {len(items)}")
    inputs = []
    for i, item in enumerate(items):
        name = "input" if len(items) == 1 else f"input[{i}]"
        if isinstance(item, str) and not item:
            refuse(name, "the input is empty")
        ids = tokenizer.encode(item) if isinstance(item, str) else token_ids(item, tokenizer, name)
        if len(ids) > context_length:
            refuse(name, f"{len(ids)} tokens exceed the context length ({context_length})")
        inputs.append(ids)
    return EmbeddingJob(
        model=req.model,
        inputs=inputs,
        pooling=_POOLING[req.pooling or "mean"],
        normalize=req.normalize is not False,
        base64=req.encoding_format == "base64",
    )


async def embed_all(job: EmbeddingJob, embed: Embed, rid: str) -> rs.EmbeddingList:
    """Every input's embedding (through `embed`, the router's route_and_embed)."""
    limit = asyncio.Semaphore(MAX_CONCURRENT)

    async def one(i: int, ids: list[int]) -> common_pb2.Embedding:
        async with limit:
            return (await embed(ids, job.pooling, f"{rid}-{i}"))[1]

    tasks = [asyncio.ensure_future(one(i, ids)) for i, ids in enumerate(job.inputs)]
    try:
        results = await asyncio.gather(*tasks)
    finally:  # the first failure (or a client gone) cancels the others
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    prompt = sum(e.prompt_tokens for e in results)
    return rs.EmbeddingList(
        data=[rs.Embedding(index=i, embedding=_encode(job, e)) for i, e in enumerate(results)],
        model=job.model,
        usage=rs.EmbeddingUsage(prompt_tokens=prompt, total_tokens=prompt),
    )


def _encode(job: EmbeddingJob, e: common_pb2.Embedding) -> list[float] | str:
    values = list(e.values)
    if job.normalize:
        norm = math.sqrt(sum(v * v for v in values)) or 1.0
        values = [v / norm for v in values]
    if job.base64:  # little-endian float32, as OpenAI's base64 encoding
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values
