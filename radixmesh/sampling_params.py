"""Sampling parameters: one schema, validated once, shared by every entry point.

The engine, the worker server and the router all build `SamplingParams` through
`SamplingParams.from_dict` (or the constructor), so an unknown or out-of-range field
fails the same way everywhere: an `InvalidArgument` (a `ValueError`) naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixmesh.errors import InvalidArgument

# Stop strings are matched against the text after every step: their count and length are
# work a client could otherwise make unbounded.
MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 1000
MAX_STOP_TOKEN_IDS = 1024
# Top logprobs per token: the default cap (vLLM's --max-logprobs default); a server may
# configure another (the full vocabulary made an 86 MB message and stalled workers).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. Defaults follow SGLang's `sampling_params`."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    # Patterns (Python `re` syntax) that end the generation when one matches the text's
    # tail (SGLang's stop_regex; radixmesh/stop_regex.py bounds their cost).
    stop_regex: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # First prompt position whose logprob is returned (None: no prompt logprobs).
    logprob_start_len: int | None = None
    # Added to the logits of these tokens before sampling (OpenAI's logit_bias: -100 bans a
    # token, +100 all but forces it). Given as a mapping {token id: bias} (ids may be
    # decimal strings, as JSON sends them); kept as (id, bias) pairs sorted by id.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # Constraints on the output, at most one.
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    choices: tuple[str, ...] | None = None
    # xgrammar's structural tag (JSON): fixed text around JSON-schema parts, e.g. a tool
    # call `<tool_call>{"name": "f", "arguments": <f's schema>}</tool_call>`.
    structural_tag: str | None = None
    # False: this request never drafts, on a worker that speculates (the output is the
    # same either way; a client may know its text copies nothing).
    speculative: bool = True

    def __post_init__(self) -> None:
        # Accept lists / single strings for the sequence fields, store tuples.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(_seq("stop", self.stop)))
        if isinstance(self.stop_regex, str):
            object.__setattr__(self, "stop_regex", (self.stop_regex,))
        elif not isinstance(self.stop_regex, tuple):
            object.__setattr__(self, "stop_regex", tuple(_seq("stop_regex", self.stop_regex)))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(
                self, "stop_token_ids", tuple(_seq("stop_token_ids", self.stop_token_ids))
            )
        if self.choices is not None and not isinstance(self.choices, tuple):
            object.__setattr__(self, "choices", tuple(_seq("choices", self.choices)))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        self._validate()

    @classmethod
    def from_dict(cls, params: Mapping[str, Any] | SamplingParams | None) -> SamplingParams:
        """Build from a mapping; unknown names raise `InvalidArgument` naming them."""
        if params is None:
            return cls()
        if isinstance(params, SamplingParams):
            return params
        if not isinstance(params, Mapping):
            raise InvalidArgument(
                "sampling_params", f"expected a dict, got {type(params).__name__}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise InvalidArgument(
                f"sampling_params.{unknown[0]}",
                f"unknown sampling parameter {unknown[0]!r}",
            )
        return cls(**{k: v for k, v in params.items() if v is not None or k in _NULLABLE})

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def constraint(self) -> tuple[str, str] | None:
        """The one constraint set, as (kind, text), or None."""
        set_ = [
            (k, v)
            for k, v in (
                ("regex", self.regex),
                ("json_schema", self.json_schema),
                ("ebnf", self.ebnf),
                ("structural_tag", self.structural_tag),
            )
            if v is not None
        ]
        if self.choices is not None:
            set_.append(("choices", "\x00".join(self.choices)))
        return set_[0] if set_ else None

    def validate_for(
        self,
        *,
        prompt_len: int,
        context_len: int,
        vocab_size: int,
        max_top_logprobs: int = MAX_TOP_LOGPROBS,
    ) -> None:
        """Checks that need the model or the server: lengths against the context, ids
        against the vocabulary, top logprobs against the server's cap."""
        if self.top_logprobs_num > max_top_logprobs:
            raise InvalidArgument(
                "top_logprobs_num", f"at most {max_top_logprobs}, got {self.top_logprobs_num}"
            )
        if prompt_len == 0:
            raise InvalidArgument("prompt", "the prompt is empty")
        if prompt_len + min(self.max_new_tokens, 1) > context_len:
            # The prompt alone leaves no room: no max_new_tokens would fit, so it is the
            # prompt's fault, not max_new_tokens'.
            raise InvalidArgument(
                "prompt",
                f"the prompt is {prompt_len} tokens; the context length is {context_len}, "
                "with room for at least one generated token",
            )
        if prompt_len + self.max_new_tokens > context_len:
            raise InvalidArgument(
                "max_new_tokens",
                f"prompt ({prompt_len} tokens) + max_new_tokens ({self.max_new_tokens}) "
                f"exceeds the context length ({context_len})",
            )
        for name, ids in (
            ("stop_token_ids", self.stop_token_ids),
            ("logit_bias", [t for t, _ in self.logit_bias]),
        ):
            for tid in ids:
                if not 0 <= tid < vocab_size:
                    raise InvalidArgument(
                        name, f"token id {tid} is outside the vocabulary [0, {vocab_size})"
                    )
        if self.logprob_start_len is not None and self.logprob_start_len >= prompt_len:
            raise InvalidArgument(
                "logprob_start_len",
                f"{self.logprob_start_len} is not before the prompt's end ({prompt_len} tokens)",
            )

    def _validate(self) -> None:
        self._validate_sampling()
        self._validate_stops()
        self._validate_outputs_and_constraints()

    def _validate_sampling(self) -> None:
        _int("max_new_tokens", self.max_new_tokens, lo=0, hi=_UINT32)
        _int("min_new_tokens", self.min_new_tokens, lo=0, hi=_UINT32)
        if self.min_new_tokens > self.max_new_tokens:
            raise InvalidArgument(
                "min_new_tokens",
                f"{self.min_new_tokens} exceeds max_new_tokens ({self.max_new_tokens})",
            )
        _float("temperature", self.temperature)
        if self.temperature < 0:
            raise InvalidArgument("temperature", f"must be >= 0, got {self.temperature}")
        _float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgument("top_p", f"must be in (0, 1], got {self.top_p}")
        _int("top_k", self.top_k, lo=-1, hi=_INT32)
        if self.top_k == 0:
            raise InvalidArgument("top_k", "must be -1 (disabled) or >= 1, got 0")
        _float("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidArgument("min_p", f"must be in [0, 1], got {self.min_p}")
        _float("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise InvalidArgument(
                "repetition_penalty", f"must be > 0, got {self.repetition_penalty}"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _float(name, value)
            if not -2.0 <= value <= 2.0:
                raise InvalidArgument(name, f"must be in [-2, 2], got {value}")
        for _, bias in self.logit_bias:
            _float("logit_bias", bias)
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise InvalidArgument("logit_bias", f"biases must be in [-100, 100], got {bias}")

    def _validate_stops(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidArgument(
                "stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}"
            )
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidArgument(
                    "stop", f"stop strings must be non-empty strings, got {_short(s)}"
                )
            if len(s) > MAX_STOP_CHARS:
                raise InvalidArgument(
                    "stop", f"a stop string has {len(s)} characters; at most {MAX_STOP_CHARS}"
                )
        self._validate_stop_regex()
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidArgument(
                "stop_token_ids",
                f"at most {MAX_STOP_TOKEN_IDS} ids, got {len(self.stop_token_ids)}",
            )
        for tid in self.stop_token_ids:
            _int("stop_token_ids", tid, lo=0, hi=_UINT32)

    def _validate_stop_regex(self) -> None:
        from radixmesh import stop_regex  # the `regex` package, loaded when used

        if not self.stop_regex:
            return
        if len(self.stop_regex) > stop_regex.MAX_PATTERNS:
            raise InvalidArgument(
                "stop_regex",
                f"at most {stop_regex.MAX_PATTERNS} patterns, got {len(self.stop_regex)}",
            )
        for p in self.stop_regex:
            if not isinstance(p, str) or not p:
                raise InvalidArgument(
                    "stop_regex", f"patterns must be non-empty strings, got {_short(p)}"
                )
            if len(p) > stop_regex.MAX_CHARS:
                raise InvalidArgument(
                    "stop_regex",
                    f"a pattern has {len(p)} characters; at most {stop_regex.MAX_CHARS}",
                )
        try:
            stop_regex.compile_patterns(self.stop_regex)
        except ValueError as e:
            raise InvalidArgument("stop_regex", str(e)) from None

    def _validate_outputs_and_constraints(self) -> None:
        for name in (
            "ignore_eos",
            "skip_special_tokens",
            "no_stop_trim",
            "return_logprob",
            "speculative",
        ):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgument(name, f"must be a bool, got {getattr(self, name)!r}")
        if self.seed is not None:
            _int("seed", self.seed, lo=0, hi=2**64 - 1)
        _int("n", self.n, lo=1, hi=_UINT32)
        _int("top_logprobs_num", self.top_logprobs_num, lo=0, hi=_UINT32)
        if self.logprob_start_len is not None:
            _int("logprob_start_len", self.logprob_start_len, lo=0, hi=_UINT32)
        for name in ("regex", "json_schema", "ebnf", "structural_tag"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidArgument(name, f"must be a string, got {type(value).__name__}")
        for c in self.choices or ():
            if not isinstance(c, str) or not c:
                raise InvalidArgument(
                    "choices", f"choices must be non-empty strings, got {_short(c)}"
                )
        constraints = [k for k in CONSTRAINT_KINDS if getattr(self, k) is not None]
        if len(constraints) > 1:
            raise InvalidArgument(
                constraints[1], f"only one constraint may be set, got {', '.join(constraints)}"
            )
        if self.choices is not None and not self.choices:
            raise InvalidArgument("choices", "the choices list is empty")


CONSTRAINT_KINDS = ("regex", "json_schema", "ebnf", "choices", "structural_tag")
_NULLABLE = {"seed", "logprob_start_len", *CONSTRAINT_KINDS}
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_TOKENS = 1024  # OpenAI takes up to 300; a bound on the work per step


def _bias_pairs(value: Any) -> tuple[tuple[int, float], ...]:
    """A {token id: bias} mapping (or pairs) as (id, bias) pairs sorted by id."""
    items = value.items() if isinstance(value, Mapping) else _seq("logit_bias", value)
    pairs = {}
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise InvalidArgument("logit_bias", f"expected {{token id: bias}}, got {_short(item)}")
        key, bias = item
        if isinstance(key, str) and key.isascii() and key.isdigit():
            key = int(key)
        _int("logit_bias", key, lo=0, hi=_UINT32)
        pairs[key] = bias
    if len(pairs) > MAX_LOGIT_BIAS_TOKENS:
        raise InvalidArgument(
            "logit_bias", f"at most {MAX_LOGIT_BIAS_TOKENS} tokens, got {len(pairs)}"
        )
    return tuple(sorted(pairs.items()))


def _seq(name: str, value: Any) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidArgument(name, f"expected a list, got {type(value).__name__}")
    return value


# The wire's integer types (common.proto): a larger value could not be sent on.
_UINT32 = 2**32 - 1
_INT32 = 2**31 - 1


def _int(name: str, value: Any, *, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(name, f"must be an integer, got {_short(value)}")
    if value < lo:
        raise InvalidArgument(name, f"must be >= {lo}, got {value}")
    if value > hi:
        raise InvalidArgument(name, f"must be <= {hi}, got {_short(value)}")


def _float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(name, f"must be a number, got {_short(value)}")
    number = value if not isinstance(value, int) or abs(value) < 2**1000 else math.inf
    if not math.isfinite(number):
        raise InvalidArgument(name, f"must be a finite number, got {_short(value)}")


def _short(value: Any) -> str:
    """A client's value in an error message, at most 80 characters of its repr."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**60 else "a huge integer"
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["SamplingParams"]


# What each field means, once: the HTTP APIs' request models take their sampling fields'
# descriptions from here (router/http/sampling_fields.py), and a test holds every field
# of SamplingParams to having one.
FIELD_DOCS: dict[str, str] = {
    "max_new_tokens": "Most tokens to generate.",
    "min_new_tokens": "Fewest tokens to generate before a stop condition may end it.",
    "temperature": "Sampling temperature; 0 is greedy.",
    "top_p": "Nucleus sampling: the smallest set of tokens whose probability reaches this.",
    "top_k": "Sample from the k most likely tokens; -1: the whole vocabulary.",
    "min_p": "Drop tokens less likely than this fraction of the most likely one's probability.",
    "repetition_penalty": "Divide (or multiply, when negative) the logits of tokens already "
    "in the prompt or output by this.",
    "frequency_penalty": "Subtract this times a token's count in the output from its logit.",
    "presence_penalty": "Subtract this from the logit of every token already in the output.",
    "stop": "Strings that end the generation (not included in the text).",
    "stop_token_ids": "Token ids that end the generation.",
    "ignore_eos": "Keep generating past the end-of-sequence token.",
    "skip_special_tokens": "Leave special tokens out of the text.",
    "no_stop_trim": "Keep the stop string that ended the generation in the text.",
    "stop_regex": "Regular expressions whose match at the text's end stops the generation.",
    "seed": "Seed of the sampling's random draws: the same seed, the same output.",
    "n": "Completions to generate for the prompt.",
    "return_logprob": "Return the log probability of each generated token.",
    "top_logprobs_num": "Alternatives returned with their log probabilities at each position.",
    "logprob_start_len": "First prompt position whose log probability is returned.",
    "logit_bias": "Added to the logits of these token ids (-100 bans a token).",
    "regex": "A regular expression the output must match.",
    "json_schema": "A JSON schema the output must be an instance of.",
    "ebnf": "An EBNF grammar the output must follow.",
    "choices": "The output is exactly one of these strings.",
    "structural_tag": "xgrammar's structural tag: fixed text around JSON-schema parts.",
    "speculative": "False: never draft tokens for this request on a worker that speculates "
    "(the output is the same either way).",
}
