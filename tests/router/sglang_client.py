"""Runs SGLang programs with the real `sglang` package's RuntimeEndpoint against a router.

`python -m tests.router.sglang_client http://127.0.0.1:PORT` with the sglang frontend on
PYTHONPATH (the Makefile installs it into .sglang-site). A separate process because
importing sglang patches transformers internals, which the test process also uses.
Prints one JSON object of results for the test (test_sglang_api.py) to check.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any

import sglang as sgl

from tests.lang.sglang_programs import programs


def run(url: str) -> dict[str, Any]:
    # No chat_template_name: the client infers it from /get_model_info's model_path.
    backend = sgl.RuntimeEndpoint(url)
    sgl.set_default_backend(backend)
    p = programs(sgl)
    out: dict[str, Any] = {
        "model_path": backend.get_model_name(),
        "chat_template": backend.get_chat_template().name,
    }

    s = p.multi_turn.run(question_1="What is the capital of France?", question_2="And of Italy?")
    out["multi_turn"] = [s["answer_1"], s["answer_2"], s.messages()]
    s = p.character.run(name="Ann", temperature=0)
    out["character"] = s["json_output"]
    s = p.options.run(topic="tea", temperature=0)
    out["options"] = [s["idea"], s["rating"], s.text()]
    s = p.typed.run(temperature=0)
    out["typed"] = {k: s[k] for k in ("hours", "half", "sky", "fruit", "legs")}
    s = p.react.run(question="What is 2+2?", temperature=0)
    out["react"] = s.text()
    s = p.parallel_encoding.run(question="What is the capital of Germany?", temperature=0)
    out["parallel_encoding"] = [s.text(), s["answer"]]

    @sgl.function
    def pick(s, method):
        s += "The capital of France is"
        s += sgl.select("city", choices=[" Paris", " Berlin", " Rome"], choices_method=method)

    methods = {
        "token_length_normalized": sgl.token_length_normalized,
        "greedy_token_selection": sgl.greedy_token_selection,
        "unconditional_likelihood_normalized": sgl.unconditional_likelihood_normalized,
    }
    out["select"] = {name: pick.run(method=m)["city"] for name, m in methods.items()}

    @sgl.function
    def phone(s, text):
        s += "Text: " + text + "\nThe phone number in the text is "
        s += sgl.gen("phone", regex=r"[0-9]{3}-[0-9]{4}", max_tokens=12)

    states = phone.run_batch(
        [{"text": f"Call Bob at 555-{n} after six."} for n in (1234, 4321, 7777)],
        temperature=0,
    )
    out["run_batch"] = [st["phone"] for st in states]

    s = p.multi_turn.run(question_1="Name a color.", question_2="And another?", stream=True)
    out["stream"] = [list(s.text_iter("answer_1")), s["answer_1"]]

    async def stream_async() -> list[str]:
        s = p.multi_turn.run(question_1="Hi!", question_2="Bye!", stream=True)
        return [piece async for piece in s.text_async_iter("answer_2")] + [s["answer_2"]]

    out["async_stream"] = asyncio.run(stream_async())

    @sgl.function
    def count(s, pattern):
        s += "Count from one to ten: one, two,"
        s += sgl.gen("rest", max_tokens=16, stop_regex=pattern)

    full = count.run(pattern=None, temperature=0)["rest"]
    literal = re.escape(full[3:6])  # its first match ends the text, the match kept
    out["stop_regex"] = [full, literal, count.run(pattern=literal, temperature=0)["rest"]]

    out["flush_cache"] = sgl.flush_cache() is None  # SGLang's returns nothing on success
    out["server_info"] = sgl.get_server_info()
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))
