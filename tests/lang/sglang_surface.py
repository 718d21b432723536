"""Prints the public surface of a frontend module as JSON: `python -m
tests.lang.sglang_surface sglang|radixmesh`. For test_sglang_surface.py, which compares
the real sglang package's (in a subprocess: importing sglang patches transformers) with
radixmesh's."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from typing import Any

FUNCTIONS = (
    "gen", "gen_int", "gen_string", "select", "function", "image", "video",
    "separate_reasoning", "flush_cache", "get_server_info", "set_default_backend",
    "system", "user", "assistant", "system_begin", "user_end",
)  # fmt: skip
METHODS = ("run", "run_batch", "trace", "cache", "bind")


def params(fn: Any) -> list[list[Any]]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append([p.name, p.kind.name, default])
    return out


def public(cls: type) -> list[str]:
    return sorted(n for n in dir(cls) if not n.startswith("_"))


def surface(name: str) -> dict[str, Any]:
    sgl = importlib.import_module(name)
    lang = "sglang.lang" if name == "sglang" else "radixmesh.lang"
    ir = importlib.import_module(f"{lang}.ir")
    interpreter = importlib.import_module(f"{lang}.interpreter" if name == "sglang" else lang)

    @sgl.function
    def prog(s: Any, a: str) -> None:
        s += a

    return {
        "names": sorted(sgl.__all__),
        "functions": {f: params(getattr(sgl, f)) for f in FUNCTIONS},
        "methods": {m: params(getattr(prog, m)) for m in METHODS},
        "endpoint": params(sgl.RuntimeEndpoint.__init__)[:5],
        "state": public(interpreter.ProgramState),
        "group": public(interpreter.ProgramStateGroup),
        "global_config": sorted(vars(sgl.global_config)),
        "regex": [ir.REGEX_INT, ir.REGEX_FLOAT, ir.REGEX_BOOL, ir.REGEX_STR],
    }


if __name__ == "__main__":
    print(json.dumps(surface(sys.argv[1])))
