"""The OpenAPI 3.1 description of the router's HTTP API, built from the pydantic models.

Served at `GET /openapi.json`. Request bodies are described by the request models
(validation schemas), replies by the response models (serialization schemas); every
authenticated route lists the errors it can answer with OpenAI's error body (Anthropic's
on the Messages API's routes, which also take the key as `x-api-key`). SGLang's native
routes (sglang_api.py) are listed with free-form JSON bodies; the replies of the Messages
and Responses APIs (built as dicts, anthropic/replies.py, responses_api/output.py) as
free-form JSON objects.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from radixmesh.router.http.anthropic import requests as anthropic_rq
from radixmesh.router.http.openai import requests as rq
from radixmesh.router.http.openai import responses as rs
from radixmesh.router.http.openai.responses_api import requests as responses_rq

_REF = "#/components/schemas/{model}"
# Routes whose stream is `event: <name>` / `data: <json>` pairs, without `[DONE]`.
_NAMED_EVENTS = ("/v1/responses", "/v1/messages")


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    summary: str
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    streams: bool = False  # `stream: true` answers text/event-stream
    authenticated: bool = True
    content_type: str = "application/json"
    free_body: bool = False  # a JSON object body without a model here (SGLang's API)
    anthropic: bool = False  # Anthropic's error body, and the key also as `x-api-key`


# SGLang's native API (router/http/sglang_api.py): (method, path, what, takes a JSON body).
_SGLANG = (
    ("post", "/generate", "text or input_ids with SGLang's sampling_params", True),
    ("put", "/generate", "text or input_ids with SGLang's sampling_params", True),
    ("get", "/get_model_info", "the served model", False),
    ("get", "/model_info", "the served model", False),
    ("get", "/get_server_info", "model, policy, gRPC port; workers' load (admin)", False),
    ("get", "/server_info", "model, policy, gRPC port; workers' load (admin)", False),
    ("get", "/flush_cache", "flush every worker's cache (admin)", False),
    ("post", "/flush_cache", "flush every worker's cache (admin)", False),
    ("post", "/abort_request", "abort the caller's request by rid (admin: anyone's)", True),
    ("get", "/health_generate", "one token generated through the router", False),
    ("post", "/concate_and_append_request", "acknowledged (a join's bookkeeping)", True),
    ("post", "/reset_prefix_cache", "vLLM's: flush every worker's cache (admin)", False),
    ("get", "/start_profile", "501: no profiler runs in this server", False),
    ("post", "/start_profile", "501: no profiler runs in this server", False),
    ("get", "/stop_profile", "501: no profiler runs in this server", False),
    ("post", "/stop_profile", "501: no profiler runs in this server", False),
    ("post", "/v1/score", "SGLang's label probabilities, or vLLM's pair scores", True),
    ("post", "/v1/rerank", "documents ranked by the model's yes / no relevance", True),
    ("put", "/v1/rerank", "documents ranked by the model's yes / no relevance", True),
    ("post", "/score", "vLLM's pair scores: the model's yes / no relevance", True),
    ("post", "/rerank", "vLLM's and Cohere's rerank: results with relevance_score", True),
    ("post", "/v2/rerank", "vLLM's and Cohere's rerank: results with relevance_score", True),
)
ENDPOINTS = (
    Endpoint("get", "/v1/models", "The served model, as a list", response=rs.ModelList),
    Endpoint("get", "/v1/models/{model}", "The served model", response=rs.Model),
    Endpoint(
        "post",
        "/v1/completions",
        "Complete prompts (text or token ids)",
        rq.CompletionRequest,
        rs.Completion,
        streams=True,
    ),
    Endpoint(
        "post",
        "/v1/chat/completions",
        "Complete a chat, with tool calling",
        rq.ChatCompletionRequest,
        rs.ChatCompletion,
        streams=True,
    ),
    Endpoint(
        "post",
        "/v1/embeddings",
        "Pooled final hidden states of the served model",
        rq.EmbeddingRequest,
        rs.EmbeddingList,
    ),
    Endpoint(
        "post",
        "/tokenize",
        "Text or messages -> token ids",
        rq.TokenizeRequest,
        rs.TokenizeResponse,
    ),
    Endpoint(
        "post", "/detokenize", "Token ids -> text", rq.DetokenizeRequest, rs.DetokenizeResponse
    ),
    Endpoint(
        "post",
        "/v1/responses",
        "OpenAI's Responses API: input items, function tools, previous_response_id",
        responses_rq.ResponsesRequest,
        streams=True,
    ),
    Endpoint(
        "post",
        "/v1/responses/input_tokens",
        "The prompt's token count of a Responses request",
        responses_rq.InputTokensRequest,
    ),
    Endpoint("get", "/v1/responses/{response_id}", "A stored response"),
    Endpoint("delete", "/v1/responses/{response_id}", "Delete a stored response"),
    Endpoint(
        "get",
        "/v1/responses/{response_id}/input_items",
        "A stored response's input items, a page (`after`, `limit`, `order`)",
    ),
    Endpoint(
        "post",
        "/v1/messages",
        "Anthropic's Messages API: content blocks, tools",
        anthropic_rq.MessagesRequest,
        streams=True,
        anthropic=True,
    ),
    Endpoint(
        "post",
        "/v1/messages/count_tokens",
        "Anthropic's token count of a messages request's prompt",
        anthropic_rq.CountTokensRequest,
        anthropic=True,
    ),
    Endpoint("get", "/health", "200 while a worker is healthy, else 503", authenticated=False),
    Endpoint("get", "/ping", "SGLang's: 200 while serving, else 503", authenticated=False),
    Endpoint("get", "/ready", "SGLang's: 200 while serving, else 503", authenticated=False),
    *(
        Endpoint(
            method,
            path,
            f"SGLang's native API: {what} (docs/router-http.md)",
            streams=body and path == "/generate",
            free_body=body,
        )
        for method, path, what, body in _SGLANG
    ),
    Endpoint(
        "get",
        "/metrics",
        "Prometheus metrics",
        authenticated=False,
        content_type="text/plain",
    ),
    Endpoint("get", "/openapi.json", "This description", authenticated=False),
)
# Anthropic's error body (anthropic/routes.py).
_ANTHROPIC_ERROR = {
    "type": "object",
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            "required": ["type", "message"],
        },
    },
    "required": ["type", "error"],
}
_ERRORS = {
    "400": "Invalid request (`param` names the field)",
    "401": "Missing or wrong API key",
    "404": "Unknown model or route",
    "429": "Every worker tried is full",
    "503": "No healthy worker, or the router is starting",
}


@functools.cache
def openapi_document(version: str) -> dict[str, Any]:
    models: list[tuple[type[BaseModel], Any]] = [(rs.ErrorResponse, "serialization")]
    for e in ENDPOINTS:
        if e.request is not None:
            models.append((e.request, "validation"))
        if e.response is not None:
            models.append((e.response, "serialization"))
    names, schemas = models_json_schema(models, ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for e in ENDPOINTS:
        paths.setdefault(e.path, {})[e.method] = _operation(e, names)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "radixmesh router",
            "version": version,
            "description": "OpenAI-compatible API of a radixmesh cluster (see docs/router-http.md)",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }


def _operation(e: Endpoint, names: dict[tuple[Any, Any], Any]) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": e.summary, "operationId": _operation_id(e)}
    if names_in_path := re.findall(r"{(\w+)}", e.path):
        op["parameters"] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in names_in_path
        ]
    if e.request is not None or e.free_body:
        schema = names[(e.request, "validation")] if e.request is not None else {"type": "object"}
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    ok: dict[str, Any] = {"description": "OK"}
    if e.request is not None and e.response is None:  # a reply built as a dict
        ok["content"] = {"application/json": {"schema": {"type": "object"}}}
    if e.response is not None:
        ok["content"] = {"application/json": {"schema": names[(e.response, "serialization")]}}
    elif e.content_type != "application/json":
        ok["content"] = {e.content_type: {"schema": {"type": "string"}}}
    if e.streams:
        what = "named SSE events" if e.path in _NAMED_EVENTS else "SSE chunks, then `data: [DONE]`"
        ok.setdefault("content", {})["text/event-stream"] = {
            "schema": {"type": "string", "description": what}
        }
    op["responses"] = {"200": ok}
    if e.authenticated:
        body = _ANTHROPIC_ERROR if e.anthropic else names[(rs.ErrorResponse, "serialization")]
        error = {"content": {"application/json": {"schema": body}}}
        op["responses"] |= {code: {"description": d, **error} for code, d in _ERRORS.items()}
        op["security"] = [{"bearer": []}, {"x-api-key": []}] if e.anthropic else [{"bearer": []}]
    return op


def _operation_id(e: Endpoint) -> str:
    words = [w for w in e.path.replace("{", "").replace("}", "").split("/") if w]
    return e.method + "_" + "_".join(w.replace(".", "_") for w in words)
