"""The language's primitives, with SGLang's names and arguments."""

from __future__ import annotations

import json
import re
from typing import Any

from radixmesh.lang.backend.registry import get_default_backend, resolve_backend
from radixmesh.lang.choices import ChoicesSamplingMethod, token_length_normalized
from radixmesh.lang.ir import (
    Expr,
    ExprList,
    Gen,
    Image,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Video,
    flatten,
    to_expr,
)
from radixmesh.lang.reasoning import check_model_type

_PARAMS = [
    "max_tokens",
    "min_tokens",
    "n",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "regex",
    "json_schema",
]
# gen's argument -> the engine's sampling-parameter name
_RENAMED = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: list[str] | None = None,
    choices_method: ChoicesSamplingMethod | None = None,
    regex: str | None = None,
    json_schema: str | dict[str, Any] | None = None,
) -> Expr:
    """A model call whose text is appended to the state (and stored as `name`).

    With `choices`, this is `select`. Arguments left None take the run's defaults.
    `dtype` (int, float, str, bool or their names) constrains the text to SGLang's
    pattern for it (`ir.REGEX_INT`, ...) and wins over `regex`; the value stays text."""
    _check_name(name)
    if choices:
        return select(
            name,
            choices,
            0.0 if temperature is None else temperature,
            choices_method or token_length_normalized,
        )
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as e:
            raise ValueError(f"regex: invalid regular expression {regex!r}: {e}") from None
    if isinstance(json_schema, dict):
        json_schema = json.dumps(json_schema)
    given = dict(locals())
    params: dict[str, Any] = {}
    for key in _PARAMS:
        if given[key] is not None:
            params[_RENAMED.get(key, key)] = given[key]
    return Gen(name, params, _dtype(dtype))


def gen_int(
    name: str | None = None,
    max_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
) -> Expr:
    """`gen(..., dtype=int)`: an integer (needs a backend with regex support)."""
    given = dict(locals())
    return gen(**given, dtype=int)


def gen_string(
    name: str | None = None,
    max_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
) -> Expr:
    """`gen(..., dtype=str)`: a double-quoted string (needs regex support)."""
    given = dict(locals())
    return gen(**given, dtype=str)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
) -> Expr:
    """Append the choice the model scores highest (see `radixmesh.lang.choices`)."""
    _check_name(name)
    if not choices or not isinstance(choices, list | tuple):
        raise ValueError("choices: select needs a non-empty list of strings")
    if not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"choices: every choice must be a non-empty string, got {choices!r}")
    if not isinstance(choices_method, ChoicesSamplingMethod):
        raise ValueError(
            f"choices_method: expected a ChoicesSamplingMethod, got {choices_method!r}"
        )
    return Select(name, list(choices), temperature, choices_method)


def image(expr: object) -> Expr:
    """Images need a multimodal model; executing this fails with a clear error."""
    return Image(expr)


def video(path: object, num_frames: int) -> Expr:
    """Videos need a multimodal model too; executing this fails like `image`."""
    return Video(path, num_frames)


def separate_reasoning(expr: object = None, model_type: str | None = None) -> Expr:
    """`expr`, then its gens' reasoning moved out of their variables: `name` keeps the
    answer and `name_reasoning_content` gets the thinking (`<think>...</think>` and the
    like, per `model_type`); the state's text keeps the answer only."""
    check_model_type(model_type)
    assert model_type is not None
    body = to_expr(expr) if expr is not None else ExprList([])
    names = [e.name for e in flatten(body) if isinstance(e, Gen | Select)]
    if any(n is None for n in names) or not names:
        raise ValueError("name: separate_reasoning needs named gen or select expressions")
    return ExprList([body, SeparateReasoning(model_type, [n for n in names if n])])


def _role(role: str, expr: object = None) -> Expr:
    if expr is None:
        return ExprList([RoleBegin(role), RoleEnd(role)])
    return ExprList([RoleBegin(role), to_expr(expr), RoleEnd(role)])


def system(expr: object = None) -> Expr:
    return _role("system", expr)


def user(expr: object = None) -> Expr:
    return _role("user", expr)


def assistant(expr: object = None) -> Expr:
    return _role("assistant", expr)


def system_begin() -> Expr:
    return RoleBegin("system")


def system_end() -> Expr:
    return RoleEnd("system")


def user_begin() -> Expr:
    return RoleBegin("user")


def user_end() -> Expr:
    return RoleEnd("user")


def assistant_begin() -> Expr:
    return RoleBegin("assistant")


def assistant_end() -> Expr:
    return RoleEnd("assistant")


def flush_cache(backend: object | None = None) -> bool:
    """Empty the backend's prefix cache (False if there is none or it is busy)."""
    if backend is None and get_default_backend() is None:
        return False
    return resolve_backend(backend).flush_cache()


def get_server_info(backend: object | None = None) -> dict[str, Any] | None:
    """What the backend serves (model, limits, workers); None when no backend is set."""
    if backend is None and get_default_backend() is None:
        return None
    return resolve_backend(backend).get_server_info()


def _check_name(name: object) -> None:
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name: a variable name must be a non-empty string, got {name!r}")


_DTYPES: dict[Any, type] = {t: t for t in (int, float, str, bool)} | {
    "int": int,
    "float": float,
    "str": str,
    "string": str,
    "bool": bool,
}


def _dtype(dtype: type | str | None) -> type | None:
    if dtype is None:
        return None
    try:
        return _DTYPES[dtype]
    except (KeyError, TypeError):
        raise ValueError(f"dtype: expected int, float, str or bool, got {dtype!r}") from None
