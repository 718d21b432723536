"""What `Engine`'s Python API takes as prompts and sampling parameters (SGLang's shapes),
normalized to one list of token-id lists and one SamplingParams per prompt."""

from __future__ import annotations

from typing import Any, Protocol

from radixmesh.errors import InvalidArgument
from radixmesh.sampling_params import SamplingParams

Prompt = str | list[str] | None
InputIds = list[int] | list[list[int]] | None
Params = dict[str, Any] | SamplingParams | list[dict[str, Any]] | list[SamplingParams] | None


class Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


def normalize_inputs(
    tokenizer: Encoder, prompt: Prompt, input_ids: InputIds
) -> tuple[list[tuple[int, ...]], bool]:
    """The prompts' token ids, and whether the call was for one prompt.

    Each prompt is a tuple of its own (the caller's list may change after the call):
    a request keeps it as its `prompt_ids` beside its `token_ids` list, and Python's
    garbage collector stops tracking a tuple of ints the first time it sees it, where a
    list's every id is visited at each collection that reaches it (a 1,600-token prompt
    a request, 1,024 requests a call on the shared-prefix workload)."""
    if (prompt is None) == (input_ids is None):
        raise InvalidArgument("prompt", "give exactly one of prompt and input_ids")
    if prompt is not None:
        if isinstance(prompt, str):
            return [tuple(tokenizer.encode(prompt))], True
        if not isinstance(prompt, list) or not all(isinstance(p, str) for p in prompt):
            raise InvalidArgument("prompt", "expected a string or a list of strings")
        if not prompt:
            raise InvalidArgument("prompt", "the prompt list is empty")
        return [tuple(tokenizer.encode(p)) for p in prompt], False
    if not isinstance(input_ids, list) or not input_ids:
        raise InvalidArgument("input_ids", "expected a non-empty list of token ids")
    items: list[Any] = list(input_ids)
    if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return [tuple(items)], True
    if all(isinstance(x, list) for x in items):
        return [tuple(x) for x in items], False
    raise InvalidArgument("input_ids", "expected a list of ints or a list of lists of ints")


def normalize_params(params: Params, count: int) -> list[SamplingParams]:
    """One SamplingParams per prompt: a list gives one each, one is shared by all."""
    if isinstance(params, list):
        if len(params) != count:
            raise InvalidArgument(
                "sampling_params", f"got {len(params)} sampling params for {count} prompts"
            )
        return [SamplingParams.from_dict(p) for p in params]
    one = SamplingParams.from_dict(params)
    return [one] * count
