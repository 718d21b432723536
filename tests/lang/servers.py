"""Minimal loopback HTTP servers over a real Engine, for the OpenAI and Anthropic backends.

Not a product server (the router serves the OpenAI-compatible API): just the
fields the backends send, enough to drive the official clients end to end.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine


def _params(body: dict[str, Any], max_key: str, stop_key: str) -> dict[str, Any]:
    p: dict[str, Any] = {"max_new_tokens": body.get(max_key, 16)}
    for key in ("temperature", "top_p", "top_k", "frequency_penalty", "presence_penalty", "n"):
        if body.get(key) is not None:
            p[key] = body[key]
    if body.get(stop_key):
        p["stop"] = body[stop_key]
    return p


def _usage(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt_tokens": meta["prompt_tokens"],
        "completion_tokens": meta["completion_tokens"],
        "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
        "prompt_tokens_details": {"cached_tokens": meta["cached_tokens"]},
    }


def _finish(meta: dict[str, Any]) -> str:
    return "length" if meta["finish_reason"]["type"] == "length" else "stop"


# Requests served per path, by every server here (tests read differences).
REQUESTS: Counter[str] = Counter()


class _Handler(BaseHTTPRequestHandler):
    engine: Engine

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        REQUESTS[self.path] += 1
        routes = {
            "/v1/chat/completions": self._chat,
            "/v1/completions": self._completions,
            "/v1/messages": self._messages,
        }
        try:
            routes[self.path](body)
        except InvalidArgument as e:
            self._json(400, {"error": {"message": str(e), "type": "invalid_request_error"}})

    def _json(self, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chat(self, body: dict[str, Any]) -> None:
        ids = self.engine.tokenizer.encode_chat(body["messages"])
        params = _params(body, "max_tokens", "stop")
        head = {"id": uuid.uuid4().hex, "created": int(time.time()), "model": body["model"]}
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            stream = self.engine.generate(input_ids=ids, sampling_params=params, stream=True)
            assert isinstance(stream, Iterator)
            for chunk in stream:
                done = chunk["meta_info"].get("finish_reason")
                choice = {
                    "index": 0,
                    "delta": {"role": "assistant", "content": chunk["text"]},
                    "finish_reason": _finish(chunk["meta_info"]) if done else None,
                }
                event = {**head, "object": "chat.completion.chunk", "choices": [choice]}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        outs = self.engine.generate(input_ids=[ids], sampling_params=[params])
        assert isinstance(outs, list)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": o["text"]},
                "finish_reason": _finish(o["meta_info"]),
            }
            for i, o in enumerate(outs)
        ]
        usage = _usage(outs[0]["meta_info"])
        self._json(200, {**head, "object": "chat.completion", "choices": choices, "usage": usage})

    def _completions(self, body: dict[str, Any]) -> None:
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        echo = bool(body.get("echo"))
        params = _params(body, "max_tokens", "stop")
        drop_output = params["max_new_tokens"] == 0  # prompt scoring only
        params["max_new_tokens"] = max(1, params["max_new_tokens"])
        tok = self.engine.tokenizer
        ids = [tok.encode(p) for p in prompts]
        if body.get("logprobs") is not None:
            params.update(return_logprob=True, logprob_start_len=0)
        outs = self.engine.generate(input_ids=ids, sampling_params=[params] * len(ids))
        assert isinstance(outs, list)
        choices = []
        for i, (prompt, pids, out) in enumerate(zip(prompts, ids, outs, strict=True)):
            text = "" if drop_output else out["text"]
            choice: dict[str, Any] = {
                "index": i,
                "text": (prompt if echo else "") + text,
                "finish_reason": _finish(out["meta_info"]),
                "logprobs": None,
            }
            if body.get("logprobs") is not None and echo:
                tokens = [tok.decode([t]) for t in pids]
                offsets = [len(tok.decode(pids[:k])) for k in range(len(pids))]
                lps = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"]]
                lps = [None] * (len(pids) - len(lps)) + lps  # a 1-token prompt gets none
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": lps,
                    "text_offset": offsets,
                    "top_logprobs": None,
                }
            choices.append(choice)
        head = {"id": uuid.uuid4().hex, "created": int(time.time()), "model": body["model"]}
        usage = _usage(outs[0]["meta_info"])
        self._json(200, {**head, "object": "text_completion", "choices": choices, "usage": usage})

    def _messages(self, body: dict[str, Any]) -> None:
        messages = list(body["messages"])
        if body.get("system"):
            messages.insert(0, {"role": "system", "content": body["system"]})
        prefill = ""
        if messages[-1]["role"] == "assistant":
            prefill = messages.pop()["content"]
        prompt = self.engine.tokenizer.apply_chat_template(messages) + prefill
        params = _params(body, "max_tokens", "stop_sequences")
        # Recent Messages API versions take no temperature; this server decodes greedily
        # then, so tests can compare its answers with the engine's.
        params.setdefault("temperature", 0.0)
        out = self.engine.generate(prompt, params)
        assert isinstance(out, dict)
        meta = out["meta_info"]
        stop = "max_tokens" if meta["finish_reason"]["type"] == "length" else "end_turn"
        self._json(
            200,
            {
                "id": "msg_" + uuid.uuid4().hex,
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": [{"type": "text", "text": out["text"]}],
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": meta["prompt_tokens"],
                    "output_tokens": meta["completion_tokens"],
                    "cache_read_input_tokens": meta["cached_tokens"],
                },
            },
        )


@contextmanager
def serve(engine: Engine) -> Iterator[str]:
    """Serve `engine` on a free loopback port; yields the base URL (no /v1)."""
    handler = type("Handler", (_Handler,), {"engine": engine})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
