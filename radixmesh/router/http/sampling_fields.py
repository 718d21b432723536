"""The sampling fields of the HTTP APIs' request models, taken from `SamplingParams`.

An API declares which of its request fields are SamplingParams fields under which names
(OpenAI's `max_tokens` is `max_new_tokens`); `with_sampling_fields` adds those fields to
a request model, each typed as JSON carries the SamplingParams field (a tuple of strings
is a string or a list of them, a tuple of ints a list) and described by its entry in
`FIELD_DOCS`. So a new sampling field is one edit where SamplingParams is defined (the
field and its description) plus its name in each API's map. Ranges are SamplingParams'
to check (`from_dict`), so a bad value reads the same over HTTP and gRPC, and where an API
defines narrower ones for its fields, its request model checks those first
(`OPENAI_RANGES`, `ANTHROPIC_RANGES`: OpenAI's temperature is 0 to 2, Anthropic's 0 to 1;
SamplingParams takes any finite temperature >= 0, and SGLang's native API keeps
SamplingParams' ranges, as SGLang does).

OpenAI's completions and chat take their sampling fields so (openai/requests.py `PARAMS`);
SGLang's native API reads SamplingParams' own names from its map (sglang_protocol.py);
Anthropic's Messages and OpenAI's Responses keep their few sampling fields declared (their
code reads them by attribute, and a required `max_tokens` is Anthropic's), described from
FIELD_DOCS.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, Field, create_model

from radixmesh.sampling_params import FIELD_DOCS, SamplingParams

M = TypeVar("M", bound=BaseModel)

# Where JSON says it otherwise than the dataclass's type does.
_JSON_TYPES: dict[str, Any] = {
    "logit_bias": dict[str, float],  # {token id as a string: bias}
    "json_schema": str | dict[str, Any],  # the schema as text or as an object
}


Bounds = tuple[float | None, float | None]  # (least, most), None: no bound that side

# Each API's documented ranges for its sampling fields, by the API's own field names.
OPENAI_RANGES: Mapping[str, Bounds] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}
ANTHROPIC_RANGES: Mapping[str, Bounds] = {"temperature": (0.0, 1.0), "top_p": (0.0, 1.0)}


def sampling_field(name: str, sp_name: str, ranges: Mapping[str, Bounds]) -> Any:
    """The pydantic field of request field `name` (SamplingParams' `sp_name`): optional,
    described by FIELD_DOCS and held to its range in `ranges`, if any (a value outside it
    is a 400 naming the field, and the API's description shows the range)."""
    least, most = ranges.get(name, (None, None))
    return Field(None, description=FIELD_DOCS[sp_name], ge=least, le=most)


def json_type(name: str) -> Any:
    """The type a request sends SamplingParams field `name` as (None excluded)."""
    if name in _JSON_TYPES:
        return _JSON_TYPES[name]
    hint = _hints()[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0] if len(args) == 1 else hint  # `X | None` -> X
        args = list(typing.get_args(hint))
    if typing.get_origin(hint) is tuple:  # tuple[T, ...]
        item = args[0]
        return str | list[str] if item is str else list[item]  # type: ignore[valid-type]
    return hint


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(SamplingParams)


def with_sampling_fields(
    base: type[M], names: Mapping[str, str], name: str, ranges: Mapping[str, Bounds] = {}
) -> type[M]:
    """A model `name` that is `base` with a field for each request name in `names`
    (request name -> SamplingParams name), optional, typed by `json_type`, described by
    FIELD_DOCS and held to the API's `ranges` (request name -> bounds)."""
    fields: dict[str, Any] = {
        api: (json_type(sp) | None, sampling_field(api, sp, ranges)) for api, sp in names.items()
    }
    model: type[M] = create_model(name, __base__=base, __module__=base.__module__, **fields)
    return model
