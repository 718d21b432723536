"""A catalogue of hostile and malformed requests against a launched cluster (one dummy:tiny
worker behind a router with HTTP), over every surface a client reaches: the OpenAI and
SGLang HTTP APIs, the router's gRPC service and the worker's (with its key).

Each case asserts the status (400 / 404 / 413 over HTTP, INVALID_ARGUMENT over gRPC;
RESOURCE_EXHAUSTED for a Score larger than the worker's queue), the
field the error names (HTTP `param`, gRPC `radixmesh-field` metadata) and a message, and
that the next normal request on the same surface is served. Hypothesis then fuzzes both
surfaces: whatever it sends, the answer is a status from the catalogue (never a 500 or
UNKNOWN), every error is JSON (or a gRPC status naming its field), and the cluster serves
after. The module prints the figures docs/reliability.md states.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.errors import FIELD_METADATA_KEY
from radixmesh.grpc_server import MAX_STATUS_BYTES
from radixmesh.v1 import common_pb2, router_pb2, worker_pb2
from tests.router.http_helpers import Http

pytestmark = pytest.mark.slow

MODEL = "dummy:tiny"
MAX_PROMPT_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
MAX_CHOICES = 8


@dataclass
class Target:
    cluster: LocalCluster
    http: Http
    router: grpc.Channel
    worker: grpc.Channel
    worker_md: tuple[tuple[str, str], ...]


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    http_port = free_port()
    router_options = {
        "http_port": http_port, "health_interval": 0.2, "max_prompt_bytes": MAX_PROMPT_BYTES,
        "max_body_bytes": MAX_BODY_BYTES, "max_choices": MAX_CHOICES,
    }  # fmt: skip
    worker_args = ("--dtype", "float32", "--grammar-max-bytes", "16384")
    config = LaunchSpec(
        model=MODEL,
        workers=1,
        port=free_port(),
        worker_args=worker_args,
        router_options=router_options,
        ready_timeout=120.0,
    )
    with LocalCluster(config) as c:
        router = grpc.insecure_channel(c.address)
        worker = grpc.insecure_channel(c.worker_addresses[0])
        md = (("authorization", f"Bearer {c.worker_key}"),)
        try:
            yield Target(c, Http(http_port), router, worker, md)
        finally:
            router.close()
            worker.close()


# ---- the catalogue ----------------------------------------------------------------------------

TALLY = {"tried": 0, "clear": 0}


@dataclass(frozen=True)
class Case:
    id: str
    surface: str  # http, router (gRPC), worker (gRPC)
    request: Any  # (method, path, body) | (rpc, message or raw bytes)
    status: int | str  # HTTP status or gRPC status name
    field: str | None  # the param / field the error names (None: none, e.g. bad JSON)
    message: str = ""  # a part of the message


def _completion(**fields: Any) -> tuple[str, str, Any]:
    return ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields})


def _chat(**fields: Any) -> tuple[str, str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return ("POST", "/v1/chat/completions", {**body, **fields})


def _native(**fields: Any) -> tuple[str, str, Any]:
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    return ("POST", "/generate", {**body, **fields})


def _sp(**params: Any) -> tuple[str, str, Any]:
    return _native(sampling_params={"max_new_tokens": 2, **params})


def _schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


HTTP_CASES = [
    # ---- the body itself
    Case(
        "not-json", "http", ("POST", "/v1/completions", b"{not json"), 400, None, "not valid JSON"
    ),
    Case(
        "not-utf8",
        "http",
        ("POST", "/v1/completions", b'{"prompt": "\xff\xfe"}'),
        400,
        None,
        "not UTF-8",
    ),
    Case(
        "deep-nesting",
        "http",
        ("POST", "/v1/completions", b"[" * 100_000 + b"]" * 100_000),
        400,
        None,
        "nests deeper",
    ),
    Case("body-a-list", "http", ("POST", "/v1/completions", [1, 2]), 400, "body", "JSON object"),
    Case("body-null", "http", ("POST", "/v1/chat/completions", None), 400, "body", "JSON object"),
    Case(
        "body-too-large",
        "http",
        ("POST", "/v1/completions", b"x" * (MAX_BODY_BYTES + 1)),
        413,
        None,
        "larger than",
    ),
    Case(
        "lone-surrogate-prompt",
        "http",
        ("POST", "/v1/completions", b'{"model": "dummy:tiny", "prompt": "a\\ud800b"}'),
        400,
        "prompt",
        "lone surrogate",
    ),
    Case(
        "lone-surrogate-key",
        "http",
        ("POST", "/v1/completions", b'{"\\udfff": 1, "model": "dummy:tiny", "prompt": "a"}'),
        400,
        "keys",
        "lone surrogate",
    ),
    Case(
        "lone-surrogate-stop",
        "http",
        ("POST", "/v1/completions", b'{"model": "dummy:tiny", "prompt": "a", "stop": ["\\ud83d"]}'),
        400,
        "stop[0]",
        "lone surrogate",
    ),
    # ---- completions
    Case("prompt-int", "http", _completion(prompt=123), 400, "prompt"),
    Case("prompt-empty-list", "http", _completion(prompt=[]), 400, "prompt"),
    Case("prompt-empty", "http", _completion(prompt=""), 400, "prompt", "empty"),
    Case(
        "prompt-too-long",
        "http",
        _completion(prompt="x" * (MAX_PROMPT_BYTES + 1)),
        400,
        "prompt",
        "bytes of prompt text",
    ),
    Case(
        "prompt-ids-out-of-vocab", "http", _completion(prompt=[999_999]), 400, "prompt", "token ids"
    ),
    Case("prompt-ids-negative", "http", _completion(prompt=[-1]), 400, "prompt", "token ids"),
    Case("prompt-ids-huge", "http", _completion(prompt=[2**70]), 400, "prompt", "token ids"),
    Case("prompt-list-mixed", "http", _completion(prompt=["a", 5]), 400, "prompt"),
    Case("max-tokens-negative", "http", _completion(max_tokens=-1), 400, "max_tokens"),
    Case("max-tokens-overflow", "http", _completion(max_tokens=2**70), 400, "max_tokens"),
    Case("max-tokens-string", "http", _completion(max_tokens="ten"), 400, "max_tokens"),
    Case("max-tokens-float", "http", _completion(max_tokens=2.5), 400, "max_tokens"),
    Case(
        "max-tokens-past-context",
        "http",
        _completion(max_tokens=10**9),
        400,
        "max_tokens",
        "context",
    ),
    Case("temperature-string", "http", _completion(temperature="hot"), 400, "temperature"),
    Case("temperature-negative", "http", _completion(temperature=-1), 400, "temperature"),
    Case(
        "temperature-infinite",
        "http",
        (
            "POST",
            "/v1/completions",
            b'{"model": "dummy:tiny", "prompt": "a", "temperature": 1e400}',
        ),
        400,
        "temperature",
        "less than or equal to 2",  # OpenAI's range
    ),
    Case("temperature-1e308", "http", _completion(temperature=1e308), 400, "temperature"),
    Case("chat-temperature-1e308", "http", _chat(temperature=1e308), 400, "temperature"),
    Case("presence-penalty-three", "http", _chat(presence_penalty=3), 400, "presence_penalty"),
    Case("top-p-zero", "http", _completion(top_p=0), 400, "top_p"),
    Case("top-p-two", "http", _completion(top_p=2), 400, "top_p"),
    Case("top-k-zero", "http", _completion(top_k=0), 400, "top_k"),
    Case("min-p-two", "http", _completion(min_p=2), 400, "min_p"),
    Case("n-zero", "http", _completion(n=0), 400, "n"),
    Case("n-thousand", "http", _completion(n=1000), 400, "n"),
    Case(
        "prompts-times-n",
        "http",
        _completion(prompt=["a", "b", "c"], n=3),
        400,
        "prompt",
        "outputs (prompts x n)",
    ),
    Case("n-past-choices", "http", _chat(n=9), 400, "n", "outputs (prompts x n)"),
    Case("logprobs-21", "http", _completion(logprobs=21), 400, "logprobs"),
    Case("logprobs-bool", "http", _completion(logprobs=True), 400, "logprobs"),
    Case("stop-int", "http", _completion(stop=5), 400, "stop"),
    Case(
        "stop-33", "http", _completion(stop=[f"s{i}" for i in range(33)]), 400, "stop", "at most 32"
    ),
    Case("stop-long", "http", _completion(stop=["x" * 1001]), 400, "stop", "at most 1000"),
    Case("stop-empty", "http", _completion(stop=[""]), 400, "stop"),
    Case("seed-negative", "http", _completion(seed=-1), 400, "seed"),
    Case("seed-overflow", "http", _completion(seed=2**70), 400, "seed"),
    Case("frequency-penalty-3", "http", _completion(frequency_penalty=3), 400, "frequency_penalty"),
    Case(
        "presence-penalty-string",
        "http",
        _completion(presence_penalty="x"),
        400,
        "presence_penalty",
    ),
    Case(
        "repetition-penalty-zero",
        "http",
        _completion(repetition_penalty=0),
        400,
        "repetition_penalty",
    ),
    Case("logit-bias-key", "http", _completion(logit_bias={"abc": 1}), 400, "logit_bias"),
    Case("logit-bias-value", "http", _completion(logit_bias={"1": 1000}), 400, "logit_bias"),
    Case("logit-bias-huge-id", "http", _completion(logit_bias={str(2**70): 1}), 400, "logit_bias"),
    Case("best-of", "http", _completion(best_of=3), 400, "best_of"),
    Case("suffix", "http", _completion(suffix="x"), 400, "suffix"),
    Case("stream-string", "http", _completion(stream="yes"), 400, "stream"),
    Case(
        "stream-options-without-stream",
        "http",
        _completion(stream_options={"include_usage": True}),
        400,
        "stream_options",
    ),
    Case("model-int", "http", _completion(model=5), 400, "model"),
    Case("model-unknown", "http", _completion(model="gpt-9"), 404, "model"),
    Case("model-missing", "http", ("POST", "/v1/completions", {"prompt": "a"}), 400, "model"),
    Case(
        "stop-token-ids-out-of-vocab",
        "http",
        _completion(stop_token_ids=[10**9]),
        400,
        "stop_token_ids",
    ),
    Case("regex-int", "http", _completion(regex=123), 400, "regex"),
    Case("regex-unclosed", "http", _completion(regex="[0-9"), 400, "regex", "invalid regex"),
    Case(
        "regex-repetition",
        "http",
        _completion(regex="a{100000}"),
        400,
        "regex",
        "repeats 100000 times",
    ),
    Case(
        "regex-nesting",
        "http",
        _completion(regex="(" * 200 + "a" + ")" * 200),
        400,
        "regex",
        "nests 200 levels",
    ),
    Case("ebnf-broken", "http", _completion(ebnf="root ::= ("), 400, "ebnf", "invalid EBNF"),
    Case(
        "ebnf-long-compiler-error",
        "http",
        _completion(ebnf='root ::= "a" ' + "b" * 16_000),
        400,
        "ebnf",
        "more characters)",
    ),
    Case("json-schema-int", "http", _completion(json_schema=123), 400, "json_schema"),
    Case(
        "json-schema-not-json",
        "http",
        _completion(json_schema="{not json"),
        400,
        "json_schema",
        "invalid JSON schema",
    ),
    Case(
        "json-schema-too-large",
        "http",
        _completion(json_schema=json.dumps({"description": "x" * 20000})),
        400,
        "json_schema",
        "at most 16384",
    ),
    Case(
        "two-constraints",
        "http",
        _completion(regex="a", ebnf='root ::= "a"'),
        400,
        "ebnf",
        "only one constraint",
    ),
    # ---- chat
    Case("messages-string", "http", _chat(messages="hi"), 400, "messages"),
    Case("messages-empty", "http", _chat(messages=[]), 400, "messages"),
    Case(
        "messages-bad-role",
        "http",
        _chat(messages=[{"role": "wizard", "content": "hi"}]),
        400,
        "messages[0]",
    ),
    Case(
        "messages-content-int",
        "http",
        _chat(messages=[{"role": "user", "content": 5}]),
        400,
        "messages[0].content",
    ),
    Case("messages-not-objects", "http", _chat(messages=[1, 2]), 400, "messages[0]"),
    Case(
        "messages-lone-surrogate",
        "http",
        (
            "POST",
            "/v1/chat/completions",
            b'{"model": "dummy:tiny", "messages": [{"role": "user", "content": "\\udc80"}]}',
        ),
        400,
        "messages[0].content",
        "lone surrogate",
    ),
    Case(
        "messages-too-long",
        "http",
        _chat(messages=[{"role": "user", "content": "y" * (MAX_PROMPT_BYTES + 1)}]),
        400,
        "messages",
        "bytes of prompt text",
    ),
    Case(
        "top-logprobs-without-logprobs",
        "http",
        _chat(top_logprobs=3),
        400,
        "top_logprobs",
        "logprobs",
    ),
    Case("top-logprobs-50", "http", _chat(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    Case(
        "max-completion-tokens-negative",
        "http",
        _chat(max_completion_tokens=-5),
        400,
        "max_completion_tokens",
    ),
    Case(
        "response-format-type",
        "http",
        _chat(response_format={"type": "xml"}),
        400,
        "response_format.type",
    ),
    Case(
        "response-format-schema-int",
        "http",
        _chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 123}}),
        400,
        "response_format.json_schema.schema",
    ),
    Case(
        "response-format-deep-schema",
        "http",
        _chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": _schema(70)},
            }
        ),
        400,
        "response_format",
        "nests",
    ),
    Case("tools-string", "http", _chat(tools="x"), 400, "tools"),
    Case("tool-choice-bad", "http", _chat(tool_choice="maybe"), 400, "tool_choice"),
    Case("audio-refused", "http", _chat(audio={"voice": "x"}), 400, "audio"),
    Case("functions-refused", "http", _chat(functions=[{"name": "f"}]), 400, "functions"),
    # ---- SGLang's native API
    Case("native-text-int", "http", _native(text=5), 400, "text"),
    Case("native-text-empty", "http", _native(text=""), 400, "text"),
    Case("native-text-and-ids", "http", _native(input_ids=[1, 2]), 400, "text", "not both"),
    Case(
        "native-ids-empty",
        "http",
        ("POST", "/generate", {"input_ids": [[]], "sampling_params": {}}),
        400,
        "input_ids",
    ),
    Case(
        "native-ids-strings", "http", ("POST", "/generate", {"input_ids": ["a"]}), 400, "input_ids"
    ),
    Case(
        "native-ids-out-of-vocab",
        "http",
        ("POST", "/generate", {"input_ids": [10**6]}),
        400,
        "input_ids",
    ),
    Case(
        "native-text-too-long",
        "http",
        _native(text="z" * (MAX_PROMPT_BYTES + 1)),
        400,
        "text",
        "bytes of prompt text",
    ),
    Case("native-params-string", "http", _native(sampling_params="x"), 400, "sampling_params"),
    Case("native-unknown-param", "http", _sp(frobnicate=1), 400, "sampling_params.frobnicate"),
    Case(
        "native-max-new-tokens",
        "http",
        _sp(max_new_tokens=-1),
        400,
        "sampling_params.max_new_tokens",
    ),
    Case(
        "native-temperature-list", "http", _sp(temperature=[]), 400, "sampling_params.temperature"
    ),
    Case("native-regex-int", "http", _sp(regex=123), 400, "sampling_params.regex"),
    Case(
        "native-json-schema-int", "http", _sp(json_schema=123), 400, "sampling_params.json_schema"
    ),
    Case(
        "native-regex-broken",
        "http",
        _sp(regex="(ab"),
        400,
        "sampling_params.regex",
        "invalid regex",
    ),
    Case(
        "native-ebnf-repetition",
        "http",
        _sp(ebnf='root ::= "a"{1,99999}'),
        400,
        "sampling_params.ebnf",
        "repeats 99999 times",
    ),
    Case(
        "native-json-schema-deep",
        "http",
        _sp(json_schema=json.dumps(_schema(100))),
        400,
        "sampling_params.json_schema",
        "nests",
    ),
    Case(
        "native-max-length-huge",
        "http",
        _sp(json_schema=json.dumps({"type": "string", "maxLength": 10**9})),
        400,
        "sampling_params.json_schema",
        "maxLength",
    ),
    Case(
        "native-n-past-choices", "http", _sp(n=9), 400, "sampling_params.n", "outputs (prompts x n)"
    ),
    Case(
        "native-top-logprobs",
        "http",
        _native(return_logprob=True, top_logprobs_num=21),
        400,
        "top_logprobs_num",
    ),
    Case("native-stop-empty", "http", _sp(stop=[""]), 400, "sampling_params.stop"),
    Case("native-unknown-field", "http", _native(frobnicate=1), 400, "frobnicate"),
    Case("native-rid-int", "http", _native(rid=5), 400, "rid"),
    Case("native-program", "http", _native(program="x"), 400, "program"),
    Case(
        "native-return-logprob-string", "http", _native(return_logprob="yes"), 400, "return_logprob"
    ),
    Case(
        "native-logprob-start-negative",
        "http",
        _native(return_logprob=True, logprob_start_len=-2),
        400,
        "logprob_start_len",
    ),
    Case(
        "native-lone-surrogate",
        "http",
        ("POST", "/generate", b'{"text": "\\ud800"}'),
        400,
        "text",
        "lone surrogate",
    ),
    # ---- other endpoints
    Case("tokenize-nothing", "http", ("POST", "/tokenize", {"model": MODEL}), 400, "prompt"),
    Case(
        "embeddings-empty",
        "http",
        ("POST", "/v1/embeddings", {"model": MODEL, "input": []}),
        400,
        "input",
    ),
    Case(
        "embeddings-int",
        "http",
        ("POST", "/v1/embeddings", {"model": MODEL, "input": 5}),
        400,
        "input",
    ),
    Case(
        "embeddings-too-long",
        "http",
        ("POST", "/v1/embeddings", {"model": MODEL, "input": "e" * (MAX_PROMPT_BYTES + 1)}),
        400,
        "input",
        "bytes of prompt text",
    ),
]


def _generate(**sampling: Any) -> router_pb2.RouterGenerateRequest:
    return router_pb2.RouterGenerateRequest(
        input=common_pb2.Input(text="hi"),
        sampling_params=common_pb2.SamplingParams(**{"max_new_tokens": 2, **sampling}),
    )


def _raw_text(text: bytes) -> bytes:
    """A RouterGenerateRequest whose input text holds bytes that are not UTF-8."""
    good = _generate().SerializeToString()
    return good.replace(b"hi", text[:2], 1)


def _wgen(ids: list[int] | None = None, **sampling: Any) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=ids or [104, 105])),
        sampling_params=common_pb2.SamplingParams(**{"max_new_tokens": 2, **sampling}),
        stream=True,
    )


def _messages(*pairs: tuple[str, str]) -> common_pb2.Input:
    return common_pb2.Input(
        messages=common_pb2.ChatMessages(
            messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in pairs]
        )
    )


def _select(choices: list[str]) -> router_pb2.SelectRequest:
    return router_pb2.SelectRequest(input=common_pb2.Input(text="The sky is"), choices=choices)


def _score(*conts: list[int]) -> worker_pb2.ScoreRequest:
    return worker_pb2.ScoreRequest(
        input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=[104, 105])),
        continuations=[
            worker_pb2.Continuation(token_ids=common_pb2.TokenIds(ids=c)) for c in conts
        ],
    )


IA = "INVALID_ARGUMENT"
# An undefined rule the compiler's message quotes whole: 16 kB, within the grammar limit.
LONG_EBNF_ERROR = 'root ::= "a" ' + "b" * 16_000
GRPC_CASES = [
    Case(
        "grpc-empty-input", "router", ("Generate", router_pb2.RouterGenerateRequest()), IA, "input"
    ),
    Case(
        "grpc-empty-ids",
        "router",
        (
            "Generate",
            router_pb2.RouterGenerateRequest(
                input=common_pb2.Input(token_ids=common_pb2.TokenIds())
            ),
        ),
        IA,
        "input.token_ids",
    ),
    Case(
        "grpc-ids-out-of-vocab",
        "router",
        (
            "Generate",
            router_pb2.RouterGenerateRequest(
                input=common_pb2.Input(token_ids=common_pb2.TokenIds(ids=[10**6]))
            ),
        ),
        IA,
        "input_ids",
    ),
    Case(
        "grpc-empty-text",
        "router",
        ("Generate", router_pb2.RouterGenerateRequest(input=common_pb2.Input(text=""))),
        IA,
        "input.text",
    ),
    Case(
        "grpc-text-too-long",
        "router",
        (
            "Generate",
            router_pb2.RouterGenerateRequest(
                input=common_pb2.Input(text="t" * (MAX_PROMPT_BYTES + 1))
            ),
        ),
        IA,
        "input.text",
        "bytes of text",
    ),
    Case(
        "grpc-message-bad-role",
        "router",
        ("Generate", router_pb2.RouterGenerateRequest(input=_messages(("wizard", "hi")))),
        IA,
        "input.messages",
    ),
    Case(
        "grpc-messages-too-long",
        "router",
        (
            "Generate",
            router_pb2.RouterGenerateRequest(
                input=_messages(("user", "m" * (MAX_PROMPT_BYTES + 1)))
            ),
        ),
        IA,
        "input.messages",
        "bytes of text",
    ),
    Case(
        "grpc-max-new-tokens-past-context",
        "router",
        ("Generate", _generate(max_new_tokens=2**32 - 1)),
        IA,
        "max_new_tokens",
        "context",
    ),
    Case(
        "grpc-top-logprobs",
        "router",
        ("Generate", _generate(return_logprob=True, top_logprobs_num=21)),
        IA,
        "sampling_params.top_logprobs_num",
        "at most 20",
    ),
    Case(
        "grpc-temperature-nan",
        "router",
        ("Generate", _generate(temperature=float("nan"))),
        IA,
        "temperature",
    ),
    Case("grpc-top-p-inf", "router", ("Generate", _generate(top_p=float("inf"))), IA, "top_p"),
    Case(
        "grpc-stop-33",
        "router",
        ("Generate", _generate(stop=[f"s{i}" for i in range(33)])),
        IA,
        "stop",
    ),
    Case(
        "grpc-regex-broken",
        "router",
        ("Generate", _generate(regex="[0-9")),
        IA,
        "regex",
        "invalid regex",
    ),
    Case(
        "grpc-json-schema-broken",
        "router",
        ("Generate", _generate(json_schema="{not json")),
        IA,
        "json_schema",
    ),
    Case(
        "grpc-ebnf-nesting",
        "router",
        ("Generate", _generate(ebnf="root ::= " + "(" * 150 + '"a"' + ")" * 150)),
        IA,
        "ebnf",
        "nests",
    ),
    Case(  # a compiler message longer than gRPC's trailers allow comes back cut, not retried
        "grpc-ebnf-long-compiler-error",
        "router",
        ("Generate", _generate(ebnf=LONG_EBNF_ERROR)),
        IA,
        "ebnf",
        "more characters)",
    ),
    Case(
        "worker-ebnf-long-compiler-error",
        "worker",
        ("Generate", _wgen(ebnf=LONG_EBNF_ERROR)),
        IA,
        "ebnf",
        "more characters)",
    ),
    Case(
        "grpc-program-id",
        "router",
        (
            "Generate",
            router_pb2.RouterGenerateRequest(
                input=common_pb2.Input(text="hi"), program_id="p" * 200
            ),
        ),
        IA,
        "program_id",
    ),
    Case(
        "grpc-request-id",
        "router",
        (
            "Generate",
            router_pb2.RouterGenerateRequest(
                input=common_pb2.Input(text="hi"), request_id="r" * 10_000
            ),
        ),
        IA,
        "request_id",
    ),
    Case(
        "grpc-not-utf8",
        "router",
        ("Generate", _raw_text(b"\xff\xfe")),
        IA,
        "request",
        "does not parse",
    ),
    Case(
        "grpc-garbage",
        "router",
        ("Generate", b"\x0a\xff\xff\xff\xff\x0f"),
        IA,
        "request",
        "does not parse",
    ),
    Case("grpc-select-no-choices", "router", ("Select", _select([])), IA, "choices"),
    Case(
        "grpc-select-too-many",
        "router",
        ("Select", _select([f"c{i}" for i in range(9)])),
        IA,
        "choices",
        "at most 8",
    ),
    Case(
        "grpc-select-empty-choice", "router", ("Select", _select(["a", ""])), IA, "continuations[1]"
    ),
    Case("grpc-select-garbage", "router", ("Select", b"\xff"), IA, "request", "does not parse"),
    Case("grpc-embed-garbage", "router", ("Embed", b"\x12\xff"), IA, "request", "does not parse"),
    Case(
        "worker-not-utf8",
        "worker",
        ("Generate", _wgen().SerializeToString().replace(b"\x68\x69", b"\xff\xfe")),
        IA,
        "request",
        "does not parse",
    ),
    Case("worker-ids-out-of-vocab", "worker", ("Generate", _wgen([10**6])), IA, "input_ids"),
    Case(
        "worker-top-logprobs",
        "worker",
        ("Generate", _wgen(return_logprob=True, top_logprobs_num=1000)),
        IA,
        "top_logprobs_num",
        "at most 20",
    ),
    Case(
        "worker-stop-ids",
        "worker",
        ("Generate", _wgen(stop_token_ids=[10**6])),
        IA,
        "stop_token_ids",
    ),
    Case(
        "worker-logprob-start",
        "worker",
        ("Generate", _wgen(return_logprob=True, logprob_start_len=50)),
        IA,
        "logprob_start_len",
    ),
    Case(
        "worker-regex-repetition",
        "worker",
        ("Generate", _wgen(regex="[a-z]{1,20000}")),
        IA,
        "regex",
        "repeats 20000 times",
    ),
    Case(
        "worker-json-schema-large",
        "worker",
        ("Generate", _wgen(json_schema=json.dumps({"enum": ["x" * 100] * 200}))),
        IA,
        "json_schema",
        "at most 16384",
    ),
    Case("worker-score-nothing", "worker", ("Score", _score()), IA, "continuations"),
    Case(  # each continuation is a request: past the worker's queue at once, not queued
        "worker-score-past-the-queue",
        "worker",
        ("Score", _score(*[[104]] * 20_000)),
        "RESOURCE_EXHAUSTED",
        None,
        "the queue is full",
    ),
    Case("worker-score-empty", "worker", ("Score", _score([104], [])), IA, "continuations[1]"),
    Case("worker-empty-input", "worker", ("Generate", worker_pb2.GenerateRequest()), IA, "input"),
]
CASES = HTTP_CASES + GRPC_CASES


def _http_call(t: Target, request: Any) -> tuple[int, dict[str, Any] | None]:
    method, path, body = request
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = t.http.request(method, path, raw)
    if resp.status_code < 400:
        return resp.status_code, None
    return resp.status_code, resp.json()["error"]  # every error is JSON (OpenAI's layout)


_SERVICES = {"router": "radixmesh.v1.Router", "worker": "radixmesh.v1.Worker"}
_STREAMING = ("Generate",)


def _grpc_call(t: Target, surface: str, rpc: str, message: Any) -> tuple[str, str | None, str]:
    channel = t.router if surface == "router" else t.worker
    md = t.worker_md if surface == "worker" else ()
    data = message if isinstance(message, bytes) else message.SerializeToString()
    method = f"/{_SERVICES[surface]}/{rpc}"
    try:
        if rpc in _STREAMING:
            call = channel.unary_stream(method)(data, metadata=md, timeout=60)
            for _ in call:
                pass
        else:
            channel.unary_unary(method)(data, metadata=md, timeout=60)
    except grpc.RpcError as e:
        field = dict(e.trailing_metadata() or ()).get(FIELD_METADATA_KEY)
        return e.code().name, field, e.details() or ""
    return "OK", None, ""


def _normal_request_served(t: Target, surface: str) -> None:
    if surface == "http":
        status, _ = _http_call(t, _completion())
        assert status == 200
    else:
        code, _, details = _grpc_call(t, surface, *(
            ("Generate", _generate()) if surface == "router" else ("Generate", _wgen())
        ))  # fmt: skip
        assert code == "OK", details


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_hostile_request_gets_a_clear_error(target: Target, case: Case) -> None:
    TALLY["tried"] += 1
    if case.surface == "http":
        status, error = _http_call(target, case.request)
        assert status == case.status, (status, error)
        assert error is not None and error["param"] == case.field, error
        assert case.message in error["message"] and error["type"], error
    else:
        code, field, details = _grpc_call(target, case.surface, *case.request)
        assert code == case.status, (code, details)
        assert field == case.field, (field, details)
        assert case.message in details, details
        assert len(details.encode()) <= MAX_STATUS_BYTES + 16  # fits gRPC's trailers
    TALLY["clear"] += 1
    _normal_request_served(target, case.surface)


def test_the_catalogue_is_long_enough() -> None:
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)


# ---- fuzzing ------------------------------------------------------------------------------------

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False), st.text(max_size=20),
)  # fmt: skip
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_FIELDS = [
    "model", "prompt", "messages", "max_tokens", "temperature", "top_p", "n", "stop", "seed",
    "logprobs", "top_logprobs", "stream", "logit_bias", "response_format", "regex", "json_schema",
    "tools", "tool_choice", "text", "input_ids", "sampling_params", "rid",
]  # fmt: skip
HTTP_STATUSES = {200, 400, 404, 413}


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/generate", "/tokenize"]),
    fields=st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=6),
)
def test_fuzzed_http_bodies_get_answers_from_the_catalogue(
    target: Target, path: str, fields: dict[str, Any]
) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, **fields}
    if "max_tokens" in fields or path == "/generate":  # keep generations short
        body["max_tokens"] = 2
        body.pop("sampling_params", None)
    status, error = _http_call(target, ("POST", path, body))
    assert status in HTTP_STATUSES, (status, error)
    if error is not None:
        assert error["message"] and error["type"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.binary(max_size=64),
    text=st.text(max_size=40),
    temperature=st.floats(),
    top_k=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    stop=st.lists(st.text(max_size=5), max_size=3),
    regex=st.none() | st.text(max_size=12),
)
def test_fuzzed_grpc_requests_get_statuses_from_the_catalogue(
    target: Target,
    data: bytes,
    text: str,
    temperature: float,
    top_k: int,
    stop: list[str],
    regex: str | None,
) -> None:
    params = common_pb2.SamplingParams(
        max_new_tokens=2, temperature=temperature, top_k=top_k, stop=stop
    )
    if regex is not None:
        params.regex = regex
    request = router_pb2.RouterGenerateRequest(
        input=common_pb2.Input(text=text), sampling_params=params
    )
    for message in (request, data):
        code, field, details = _grpc_call(target, "router", "Generate", message)
        assert code in ("OK", "INVALID_ARGUMENT"), (code, details)
        if code == "INVALID_ARGUMENT":
            assert field and details


def test_the_cluster_still_serves_and_the_figures(target: Target) -> None:
    """Last in the module: after everything above, both surfaces serve."""
    _normal_request_served(target, "http")
    _normal_request_served(target, "router")
    _normal_request_served(target, "worker")
    print(f"hostile inputs: {TALLY['tried']} tried, {TALLY['clear']} clear errors")
