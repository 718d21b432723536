"""Batched next-token sampling with every SGLang sampling parameter, and logprobs.

One `Sampler.sample` call turns the last-position logits of a batch (`[N, V]`) into one
token per row. Each row carries its own `SamplingParams`; the pipeline, row-batched, is

    penalties (repetition, frequency, presence)
      -> min_new_tokens ban of stop ids
      -> vocab_mask (allowed tokens, from constrained decoding)
      -> [logprobs are read here]
      -> temperature -> top-k -> top-p -> min-p -> draw (greedy rows: argmax)

The sampler is stateless: everything a row needs (prompt and output ids, its generator)
comes in its `SamplingRow`, so the scheduler may reorder, preempt or drop rows freely.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixmesh.sampling_params import SamplingParams

# Exponential noise is clamped away from 0: -log(0) = +inf would turn a banned (-inf)
# logit into NaN, and argmax picks NaN.
_TINY = torch.finfo(torch.float32).tiny

TopLogprobs = list[tuple[int, float]]  # (token id, logprob), best first


@dataclass
class SamplingRow:
    """One row of the logits to sample, with the request state its parameters need.

    `stop_ids` are the tokens that would end this request right now: the model's EOS ids
    unless `params.ignore_eos`, plus `params.stop_token_ids` (see `stop_token_set`). They
    are banned while `len(output_ids) < params.min_new_tokens`. With `ignore_eos` the EOS
    token is an ordinary token, so it is neither a stop nor banned.
    """

    params: SamplingParams
    prompt_ids: Sequence[int]  # repetition_penalty (HF semantics: prompt + output tokens)
    output_ids: Sequence[int]  # frequency/presence penalties (OpenAI: output only)
    stop_ids: frozenset[int] = frozenset()
    # Set when params.seed is: the row's draws then depend only on its own seed and step.
    generator: torch.Generator | None = None


@dataclass
class SampleOutput:
    """Tokens of one step, and logprobs for the rows with `params.return_logprob`.

    `logprobs` is None when no row asked; otherwise it has one entry per row, None for the
    rows that did not ask. `top_logprobs` likewise: None when no row asked, else one list
    per row (empty for rows that did not ask or asked for 0).
    """

    token_ids: list[int]  # [N]
    logprobs: list[float | None] | None = None  # [N]
    top_logprobs: list[TopLogprobs] | None = None  # [N][top_logprobs_num]


def stop_token_set(params: SamplingParams, eos_ids: Sequence[int]) -> frozenset[int]:
    """The ids that end a request with `params`: EOS (unless ignore_eos) + stop_token_ids."""
    eos = () if params.ignore_eos else tuple(eos_ids)
    return frozenset((*eos, *params.stop_token_ids))


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A per-request generator for `params.seed`; create it once per request, not per step."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _needs_penalty(p: SamplingParams) -> bool:
    return (
        p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
    )


def _min_tokens_active(row: SamplingRow) -> bool:
    return bool(row.stop_ids) and len(row.output_ids) < row.params.min_new_tokens


class Sampler:
    """Samples one token per row of `[N, V]` logits; see the module docstring for order.

    Logprobs are `log_softmax` of the logits after penalties, the min_new_tokens ban and
    the vocab mask, but before temperature, top-k, top-p and min-p. That is the model's
    distribution under the request's hard rules, which is what OpenAI-style logprobs and
    `select` scoring compare across choices; a sampling temperature would distort it.
    """

    def __init__(self, vocab_size: int) -> None:
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be > 0, got {vocab_size}")
        self.vocab_size = vocab_size

    def sample(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        vocab_mask: torch.Tensor | None = None,
    ) -> SampleOutput:
        """Sample `[N, V]` float logits (not modified) for `rows` (len N).

        `vocab_mask` is `[N, V]` bool, True where a token is allowed; each row must allow at
        least one token that is not otherwise banned. Columns past `vocab_size` (padding of
        the LM head) are never sampled.
        """
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [N={len(rows)}, V], got {tuple(logits.shape)}")
        logits = logits[:, : self.vocab_size]  # [N, V]
        if vocab_mask is None and _all_plain_greedy(rows):
            # The common benchmark path: one kernel, no copies.
            return SampleOutput(token_ids=logits.argmax(dim=-1).tolist())

        logits = self._apply_rules(logits, rows, vocab_mask)  # [N, V], a fresh tensor
        token_ids = self._draw(logits, rows)  # [N]
        out = SampleOutput(token_ids=token_ids.tolist())
        lp_rows = [i for i, r in enumerate(rows) if r.params.return_logprob]
        if lp_rows:
            _fill_logprobs(out, logits, token_ids, rows, lp_rows)
        return out

    # --- hard rules: penalties, bans, masks -------------------------------------------

    def _apply_rules(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], vocab_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """`[N, V]` float logits after penalties, bans and the mask; never the caller's."""
        pen_rows = [i for i, r in enumerate(rows) if _needs_penalty(r.params)]
        bans = self._ban_pairs(rows)
        if not pen_rows and not bans and vocab_mask is None:
            return logits.float()  # nothing downstream writes into it
        logits = logits.float().clone()  # [N, V]
        if pen_rows:
            logits[pen_rows] = self._penalized(logits[pen_rows], [rows[i] for i in pen_rows])
        if bans:
            row_idx, tok_idx = zip(*bans, strict=True)
            logits[list(row_idx), list(tok_idx)] = -math.inf
        if vocab_mask is not None:
            logits.masked_fill_(~vocab_mask[:, : self.vocab_size], -math.inf)
        return logits

    def _penalized(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """Penalties for the M rows that have any, vectorized over `[M, V]`.

        repetition (HF): a logit of a token seen in prompt or output is divided by the
        penalty when positive, multiplied when negative. Then (OpenAI) frequency and
        presence: `logit -= freq * count_in_output + pres * (count_in_output > 0)`.
        """
        dev = logits.device
        out_counts = self._counts([r.output_ids for r in rows], dev)  # [M, V] int
        rep = torch.tensor([r.params.repetition_penalty for r in rows], device=dev)[:, None]
        if bool((rep != 1.0).any()):
            seen = (self._counts([r.prompt_ids for r in rows], dev) > 0) | (out_counts > 0)
            scaled = torch.where(logits > 0, logits / rep, logits * rep)
            logits = torch.where(seen, scaled, logits)
        freq = torch.tensor([r.params.frequency_penalty for r in rows], device=dev)[:, None]
        pres = torch.tensor([r.params.presence_penalty for r in rows], device=dev)[:, None]
        return logits - freq * out_counts - pres * (out_counts > 0)

    def _counts(self, id_lists: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
        """`[M, V]` occurrence counts of each row's ids, from one bincount over the batch."""
        m, v = len(id_lists), self.vocab_size
        lengths = torch.tensor([len(ids) for ids in id_lists], device=device)  # [M]
        flat = torch.tensor(list(itertools.chain.from_iterable(id_lists)), dtype=torch.long,
                            device=device)  # [sum(lengths)]
        row_of = torch.repeat_interleave(torch.arange(m, device=device), lengths)
        return torch.bincount(row_of * v + flat, minlength=m * v).view(m, v)

    def _ban_pairs(self, rows: Sequence[SamplingRow]) -> list[tuple[int, int]]:
        """(row, token) pairs of stop ids banned by min_new_tokens this step."""
        return [
            (i, t)
            for i, r in enumerate(rows)
            if _min_tokens_active(r)
            for t in r.stop_ids
            if t < self.vocab_size
        ]

    # --- drawing ------------------------------------------------------------------------

    def _draw(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """`[N]` token ids: argmax for greedy rows, a filtered random draw for the others."""
        sampled = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        if not sampled:
            return logits.argmax(dim=-1)
        tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        greedy = [i for i, r in enumerate(rows) if r.params.is_greedy]
        if greedy:
            tokens[greedy] = logits[greedy].argmax(dim=-1)
        sub_rows = [rows[i] for i in sampled]
        x = _filtered(logits[sampled], [r.params for r in sub_rows])  # [S, V]
        tokens[sampled] = _gumbel_argmax(x, [r.generator for r in sub_rows])
        return tokens


def _all_plain_greedy(rows: Sequence[SamplingRow]) -> bool:
    for r in rows:
        p = r.params
        if not p.is_greedy or p.return_logprob or _needs_penalty(p) or _min_tokens_active(r):
            return False
    return True


def _filtered(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, top-p, min-p: `[S, V]` scaled logits, -inf where removed.

    Each filter acts on the distribution the previous one left (top-p renormalizes after
    top-k). Every filter keeps the most likely token, so no row becomes empty. All masks
    are built in vocabulary order, so a seeded row's draw does not depend on which path
    (plain, top-k only, sorted) the rest of the batch forced.
    """
    dev = logits.device
    temp = torch.tensor([p.temperature for p in params], device=dev)[:, None]
    x = logits / temp  # [S, V]
    v = x.shape[-1]
    ks = [p.top_k if 0 < p.top_k < v else v for p in params]
    needs_top_p = any(p.top_p < 1.0 for p in params)
    if needs_top_p:
        _top_k_top_p_sorted(x, ks, [p.top_p for p in params])
    elif any(k < v for k in ks):
        _top_k_threshold(x, ks)
    if any(p.min_p > 0.0 for p in params):
        # p_i < min_p * p_max  <=>  x_i < x_max + log(min_p); log(0) = -inf keeps all.
        log_min_p = torch.tensor([p.min_p for p in params], device=dev).log()[:, None]
        x.masked_fill_(x < x.max(dim=-1, keepdim=True).values + log_min_p, -math.inf)
    return x


def _top_k_threshold(x: torch.Tensor, ks: list[int]) -> None:
    """Top-k without a full sort: drop what is below each row's k-th largest value."""
    k = torch.tensor(ks, device=x.device)[:, None]  # [S, 1]
    top = x.topk(max(ks), dim=-1).values  # [S, kmax], descending
    kth = top.gather(-1, k - 1)  # [S, 1]
    x.masked_fill_(x < kth, -math.inf)


def _top_k_top_p_sorted(x: torch.Tensor, ks: list[int], top_ps: list[float]) -> None:
    """Top-k then top-p (smallest prefix of mass >= p) via one descending sort, in place."""
    dev = x.device
    sorted_x, order = x.sort(dim=-1, descending=True)  # [S, V] each
    ranks = torch.arange(x.shape[-1], device=dev)  # [V]
    sorted_x.masked_fill_(ranks >= torch.tensor(ks, device=dev)[:, None], -math.inf)
    probs = sorted_x.softmax(dim=-1)  # [S, V], renormalized after top-k
    mass_before = probs.cumsum(dim=-1) - probs  # [S, V]
    # p = 1 must keep everything: rounding can push the cumulative mass past 1.0.
    p = torch.tensor([tp if tp < 1.0 else math.inf for tp in top_ps], device=dev)[:, None]
    remove_sorted = (mass_before > p) | (sorted_x == -math.inf)  # [S, V]
    remove = torch.empty_like(remove_sorted).scatter_(-1, order, remove_sorted)
    x.masked_fill_(remove, -math.inf)


def _gumbel_argmax(x: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """Draw from softmax(x) per row as argmax(x - log E), E ~ Exp(1) (the Gumbel-max trick).

    Unseeded rows share one batched noise draw; a seeded row gets V fresh draws from its
    own generator in vocabulary order, so its token depends only on its seed, its step and
    its own logits, never on the batch around it.
    """
    noise = torch.empty_like(x).exponential_()  # [S, V]
    for j, gen in enumerate(generators):
        if gen is not None:
            noise[j].exponential_(generator=gen)
    return (x - noise.clamp_min_(_TINY).log_()).argmax(dim=-1)


def _fill_logprobs(
    out: SampleOutput,
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    rows: Sequence[SamplingRow],
    lp_rows: list[int],
) -> None:
    """Chosen-token and top logprobs for the rows that asked (see `Sampler` for which)."""
    chosen, tops = token_logprobs(
        logits[lp_rows], token_ids[lp_rows], max(rows[i].params.top_logprobs_num for i in lp_rows)
    )
    n = len(rows)
    out.logprobs = [None] * n
    out.top_logprobs = [[] for _ in range(n)]
    for j, i in enumerate(lp_rows):
        out.logprobs[i] = chosen[j]
        out.top_logprobs[i] = tops[j][: rows[i].params.top_logprobs_num]


def token_logprobs(
    logits: torch.Tensor, target_ids: torch.Tensor, top_k: int = 0
) -> tuple[list[float], list[TopLogprobs]]:
    """Logprob of `target_ids[i]` under `log_softmax(logits[i])`, plus the top-k tokens.

    logits: `[N, V]` (raw model logits for prompt scoring: position i's logits score
    token i+1, so pass `logits[:-1]` with `ids[1:]`); target_ids: `[N]` long.
    Returns `[N]` logprobs and, per row, `top_k` (id, logprob) pairs, best first
    (empty lists when top_k is 0).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # [N, V]
    chosen = logp.gather(-1, target_ids.long().view(-1, 1)).view(-1)  # [N]
    if top_k <= 0:
        return chosen.tolist(), [[] for _ in range(logits.shape[0])]
    top = logp.topk(min(top_k, logp.shape[-1]), dim=-1)  # [N, k] each, descending
    tops = [
        list(zip(ids, vals, strict=True))
        for ids, vals in zip(top.indices.tolist(), top.values.tolist(), strict=True)
    ]
    return chosen.tolist(), tops


__all__ = [
    "SampleOutput",
    "Sampler",
    "SamplingRow",
    "make_generator",
    "stop_token_set",
    "token_logprobs",
]
