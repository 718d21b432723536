"""Batched next-token sampling with every SGLang sampling parameter, and logprobs.

One `Sampler.sample` call turns the last-position logits of a batch (`[N, V]`) into one
token per row. Each row carries its own `SamplingParams`; the pipeline, row-batched, is

    logit_bias (added to the listed tokens' logits)
      -> penalties (repetition, frequency, presence)
      -> min_new_tokens ban of stop ids
      -> vocab_mask / allowed (allowed tokens; `allowed` is constrained decoding's one
         packed bitmask per step, for its rows only)
      -> [logprobs are read here]
      -> temperature -> top-k -> top-p -> min-p -> draw (greedy rows: argmax)

The sampler is stateless: everything a row needs (prompt and output ids, its generator)
comes in its `SamplingRow`, so the scheduler may reorder, preempt or drop rows freely.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.constrained.bitmask import TokenBitmask
from radixmesh.worker.forward_batch import to_device

# Top-k / top-p work in each row's top-W tokens, trying these W in turn: on SmolLM2 at
# temperature 1 the top 256 tokens hold more than 0.9 of the mass in ~97% of steps, the
# top 4096 in ~99.9%, and topk(256) costs a small fraction of a full-vocabulary sort.
_TOP_WINDOWS = (256, 4096)
# On CUDA, at most this many top-p rows (without top-k) are drawn by a full sort instead
# of the windows, whose coverage is read back (`_sample`).
_SORTED_TOP_P_ROWS = 8
_SORT_TOP_P_ON = ("cuda",)  # device types (on the CPU nothing waits: the windows are cheaper)
# Keeps the inverse-CDF draw's target strictly below the total despite rounding.
_BELOW_ONE = 1.0 - 2.0**-20
# Validation only asks temperature > 0; below this, logits / T could overflow to inf (and
# the draw to NaN), while the distribution is already argmax for any real logits.
_MIN_TEMPERATURE = 1e-5

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


@dataclass
class Draw:
    """`SampleOutput` with the tokens still on the device (`Sampler.draw`)."""

    token_ids: torch.Tensor  # [N]
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
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


def reads_output_ids(p: SamplingParams) -> bool:
    """Whether sampling a row with these params reads its `output_ids` (else it may be
    empty): penalties count them, min_new_tokens compares their number."""
    return _needs_penalty(p) or p.min_new_tokens > 0


def _min_tokens_active(row: SamplingRow) -> bool:
    return bool(row.stop_ids) and len(row.output_ids) < row.params.min_new_tokens


class Sampler:
    """Samples one token per row of `[N, V]` logits; see the module docstring for order.

    Logprobs are `log_softmax` of the logits after logit_bias, penalties, the
    min_new_tokens ban and the vocab mask, but before temperature, top-k, top-p and min-p.
    That is the model's
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
        allowed: TokenBitmask | None = None,
    ) -> SampleOutput:
        """`draw`, with the tokens read back to the host."""
        d = self.draw(logits, rows, vocab_mask, allowed)
        return SampleOutput(d.token_ids.tolist(), d.logprobs, d.top_logprobs)

    def draw(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        vocab_mask: torch.Tensor | None = None,
        allowed: TokenBitmask | None = None,
    ) -> Draw:
        """Sample `[N, V]` float logits (not modified) for `rows` (len N): the tokens stay
        on the logits' device; logprobs, for the rows that ask, come back to the host.

        `vocab_mask` is `[N, V]` bool, True where a token is allowed; each row must allow at
        least one token that is not otherwise banned. Columns past `vocab_size` (padding of
        the LM head) are never sampled. `allowed` is the packed form for some rows only
        (constrained decoding's one bitmask per step); other rows are not touched.
        """
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [N={len(rows)}, V], got {tuple(logits.shape)}")
        if vocab_mask is None and allowed is None and all_plain_greedy(rows):
            return self.argmax(logits)  # the common benchmark path
        logits = logits[:, : self.vocab_size]  # [N, V]

        # [N, V]: our own copy if any rule applied, else the caller's, which is only read.
        logits = self._apply_rules(logits, rows, vocab_mask, allowed)
        out = Draw(token_ids=self._draw(logits, rows))  # [N]
        lp_rows = [i for i, r in enumerate(rows) if r.params.return_logprob]
        if lp_rows:
            _fill_logprobs(out, logits, out.token_ids, rows, lp_rows)
        return out

    def argmax(self, logits: torch.Tensor) -> Draw:
        """`draw` for rows that are all plain greedy (`all_plain_greedy`) with no mask:
        one kernel, no copies."""
        if logits.shape[-1] != self.vocab_size:
            logits = logits[:, : self.vocab_size]
        return Draw(token_ids=logits.argmax(dim=-1))

    # --- hard rules: penalties, bans, masks -------------------------------------------

    def _apply_rules(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        vocab_mask: torch.Tensor | None,
        allowed: TokenBitmask | None = None,
    ) -> torch.Tensor:
        """`[N, V]` float logits after bias, penalties, bans and the mask; never the
        caller's."""
        pen_rows = [i for i, r in enumerate(rows) if _needs_penalty(r.params)]
        bans = self._ban_pairs(rows)
        bias_rows = [i for i, r in enumerate(rows) if r.params.logit_bias]
        if not pen_rows and not bans and not bias_rows and vocab_mask is None and allowed is None:
            return logits.float()  # nothing downstream writes into it
        logits = logits.float().contiguous().clone()  # [N, V]
        if bias_rows:
            self._apply_bias(logits, rows, bias_rows)
        if pen_rows:
            self._apply_penalties(logits, rows, pen_rows)
        if bans:
            row_idx, tok_idx = zip(*bans, strict=True)
            logits[list(row_idx), list(tok_idx)] = -math.inf
        if vocab_mask is not None:
            logits.masked_fill_(~vocab_mask[:, : self.vocab_size], -math.inf)
        if allowed is not None:
            allowed.apply_(logits)
        return logits

    def _apply_bias(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], bias_rows: list[int]
    ) -> None:
        """`logits[row, token] += bias` for each row's logit_bias (ids < vocab_size: the
        request was validated against the model's vocabulary)."""
        row_idx, tok_idx, values = [], [], []
        for i in bias_rows:
            for token, bias in rows[i].params.logit_bias:
                row_idx.append(i)
                tok_idx.append(token)
                values.append(bias)
        dev = logits.device
        logits[_on(dev, row_idx), _on(dev, tok_idx)] += _on(dev, values, logits.dtype)

    def _apply_penalties(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], pen_rows: list[int]
    ) -> None:
        """Penalize `logits` (`[N, V]`, our own contiguous copy) in place at the tokens
        that occur.

        repetition (HF): a logit of a token seen in prompt or output is divided by the
        penalty when positive, multiplied when negative. Then (OpenAI) frequency and
        presence: `logit -= freq * count_in_output + pres * (count_in_output > 0)`.
        Work is O(prompt + output tokens) of the penalized rows, never O(V): only the
        occurring (row, token) keys `row * V + token` are touched. The keys are found
        and counted on the host, where the ids are (a `torch.unique` on the device reads
        its output's size back, a wait for the forward), and go to the device in pinned
        copies, so the draw can queue behind the forward (overlap.py).
        """
        flat, dev, v = logits.view(-1), logits.device, self.vocab_size
        out_keys, counts = np.unique(
            self._keys([(i, rows[i].output_ids) for i in pen_rows]), return_counts=True
        )  # [U] sorted unique keys, [U] occurrences in the output
        rep_rows = [i for i in pen_rows if rows[i].params.repetition_penalty != 1.0]
        if rep_rows:
            prompt_keys = self._keys([(i, rows[i].prompt_ids) for i in rep_rows])
            seen = _on_array(dev, np.unique(np.concatenate([prompt_keys, out_keys])))  # [Q]
            rep = _on(dev, [r.params.repetition_penalty for r in rows])  # [N]
            vals, factor = flat[seen], rep[seen // v]
            flat[seen] = torch.where(vals > 0, vals / factor, vals * factor)
        if len(out_keys):
            keys = _on_array(dev, out_keys)
            row = keys // v  # [U]
            freq = _on(dev, [r.params.frequency_penalty for r in rows])
            pres = _on(dev, [r.params.presence_penalty for r in rows])
            flat[keys] -= freq[row] * _on_array(dev, counts) + pres[row]

    def _keys(self, id_lists: Sequence[tuple[int, Sequence[int]]]) -> np.ndarray:
        """Flat keys `row * V + token` of every (row, ids) pair, on the host."""
        v = self.vocab_size
        parts = [np.asarray(ids, dtype=np.int64) + row * v for row, ids in id_lists if len(ids)]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

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
        """`[N]` token ids: argmax for greedy rows, a filtered random draw for the others.

        Unseeded rows are drawn together from the global RNG. Each seeded row is drawn on
        its own (`[1, V]`) from its generator, so its token depends only on its seed, its
        step and its own logits: the same ops on the same shapes whatever the batch.
        """
        sampled = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        if not sampled:
            return logits.argmax(dim=-1)
        dev = logits.device
        tokens = torch.empty(len(rows), dtype=torch.long, device=dev)
        greedy = [i for i, r in enumerate(rows) if r.params.is_greedy]
        if greedy:
            tokens[_on(dev, greedy)] = _take(logits, greedy).argmax(dim=-1)
        shared = [i for i in sampled if rows[i].generator is None]
        if shared:
            drawn = _sample(_take(logits, shared), [rows[i].params for i in shared], None)
            tokens[_on(dev, shared)] = drawn
        for i in sampled:
            if rows[i].generator is not None:
                tokens[i] = _sample(logits[i : i + 1], [rows[i].params], rows[i].generator)[0]
        return tokens


def _take(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """`t[rows]` for ascending unique `rows`; `t` itself (no copy) when that is every row."""
    return t if len(rows) == t.shape[0] else t.index_select(0, _on(t.device, rows))


def _on_array(device: torch.device, values: np.ndarray) -> torch.Tensor:
    """`_on` for a numpy array (no copy on the host)."""
    return to_device(torch.from_numpy(values), device)


def _on(
    device: torch.device, values: Sequence[int] | Sequence[float], dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A host list as a tensor on `device` without waiting for the stream. On CUDA
    `torch.tensor(values, device=)` copies from pageable memory, which waits for every
    kernel queued before it: a sampled step's draw (run behind the forward, overlap.py)
    would wait for the forward at each one."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def plain_greedy_params(p: SamplingParams) -> bool:
    """Whether every row with these params is plain greedy (`all_plain_greedy`), whatever
    its output so far: as that, with no min_new_tokens at all (its ban depends on the
    row's output). A step whose requests share a few params objects checks each once,
    without building a `SamplingRow` per row."""
    return (
        p.is_greedy
        and not p.return_logprob
        and not _needs_penalty(p)
        and not p.logit_bias
        and p.min_new_tokens == 0
    )


def all_plain_greedy(rows: Sequence[SamplingRow]) -> bool:
    """Whether every row draws its argmax with no rule applied: greedy, no logprobs, no
    penalty, no logit bias, no min_new_tokens ban in force. A row that is stays so with
    more output ids (the ban only lifts), so a drafting row's later positions do too."""
    for r in rows:
        p = r.params
        if not p.is_greedy or p.return_logprob or _needs_penalty(p) or _min_tokens_active(r):
            return False
        if p.logit_bias:
            return False
    return True


def _sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], gen: torch.Generator | None
) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p, then one draw per row: `[R, V]` -> `[R]` ids.

    Each filter acts on the distribution the previous one left (top-p renormalizes after
    top-k) and keeps the most likely token, so no row becomes empty. Rows with top-k or
    top-p are filtered and drawn inside their top-W window (W >= every top-k), which is
    exact once the window holds more than top_p of the mass: first W = 256, then 4096
    for the rows that needed more, then a full sort for what is left.

    Whether a window held a top-p row (without top-k) is read back, a wait for the
    device. On CUDA up to `_SORTED_TOP_P_ROWS` such rows skip the windows for the full
    sort, which needs no read, so a small batch's draw queues behind the forward (the
    overlap scheduler's: worker/overlap.py); a larger batch's sort would cost more than
    the wait.
    """
    dev, v = logits.device, logits.shape[-1]
    temps = [max(p.temperature, _MIN_TEMPERATURE) for p in params]
    x = logits / _on(dev, temps)[:, None]  # [R, V]
    ks = [p.top_k if 0 < p.top_k < v else v for p in params]
    tokens = torch.empty(len(params), dtype=torch.long, device=dev)
    pending = [i for i in range(len(params)) if ks[i] < v or params[i].top_p < 1.0]
    sort_now: list[int] = []
    if dev.type in _SORT_TOP_P_ON:
        sort_now = [i for i in pending if ks[i] == v]
        if len(sort_now) <= _SORTED_TOP_P_ROWS:
            pending = [i for i in pending if ks[i] < v]
        else:
            sort_now = []
    for window in _TOP_WINDOWS:
        if pending:
            pending = _draw_windowed(x, pending, ks, params, window, gen, tokens)
    if sort_now:
        pending = sorted(pending + sort_now)
    if pending:  # top-p rows whose cut lies past every window (or that skip them)
        xs = _take(x, pending)
        _top_p_sorted(xs, [params[i].top_p for i in pending])
        tokens[_on(dev, pending)] = _cdf_draw(_min_p(xs, [params[i] for i in pending]), gen)
    plain = [i for i in range(len(params)) if ks[i] == v and params[i].top_p >= 1.0]
    if plain:
        drawn = _cdf_draw(_min_p(_take(x, plain), [params[i] for i in plain]), gen)
        tokens[_on(dev, plain)] = drawn
    return tokens


def _draw_windowed(
    x: torch.Tensor,
    rows: list[int],
    ks: list[int],
    params: Sequence[SamplingParams],
    window: int,
    gen: torch.Generator | None,
    tokens: torch.Tensor,
) -> list[int]:
    """Draw `rows` of `x` (`[R, V]`) into `tokens` where a top-`window` window decides
    them; returns the rows it could not decide."""
    vals, idx, covered = _window_filter(
        _take(x, rows), [ks[i] for i in rows], [params[i].top_p for i in rows], window
    )  # [R', W], [R', W], [R']
    v = x.shape[-1]
    # A top-k row is always decided (the window holds its k); only a top-p-only row's
    # coverage depends on its logits, and reading it back waits for the device.
    flags = [True] * len(rows) if all(ks[i] < v for i in rows) else covered.tolist()
    done = [j for j, c in enumerate(flags) if c]
    if done:
        vals = _min_p(_take(vals, done), [params[rows[j]] for j in done])
        pos = _cdf_draw(vals, gen)  # [R'']
        chosen = _take(idx, done).gather(-1, pos[:, None]).view(-1)
        tokens[_on(tokens.device, [rows[j] for j in done])] = chosen
    return [rows[j] for j, c in enumerate(flags) if not c]


def _window_filter(
    x: torch.Tensor, ks: list[int], top_ps: list[float], window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k and top-p inside each row's top-W tokens (W >= window and >= every k < V).

    Returns the window's logits (descending, -inf where removed) `[R, W]`, their token ids
    `[R, W]`, and `[R]` bool: the window decided the row. It does for every top-k row, and
    for a top-p-only row when the window holds more than top_p of the mass, since every
    token past the window then has more than top_p before it.
    """
    dev, v = x.device, x.shape[-1]
    w = min(v, max([window, *(k for k in ks if k < v)]))
    vals, idx = x.topk(w, dim=-1)  # [R, W] each, descending
    ranks = torch.arange(w, device=dev)
    vals.masked_fill_(ranks >= _on(dev, [min(k, w) for k in ks])[:, None], -math.inf)
    covered = _on(dev, [k < v for k in ks])  # [R] bool
    if all(p >= 1.0 for p in top_ps):
        return vals, idx, covered
    lse = vals.logsumexp(dim=-1, keepdim=True)  # [R, 1]: the top-k set's normalizer...
    whole = [i for i, k in enumerate(ks) if k == v]
    if whole:  # ...or the whole vocabulary's for rows without top-k
        lse[_on(dev, whole)] = _take(x, whole).logsumexp(dim=-1, keepdim=True)
    probs = (vals - lse).exp()  # [R, W]
    cum = probs.cumsum(dim=-1)  # [R, W]
    # p = 1 must keep everything: rounding can push the cumulative mass past 1.0.
    p = _on(dev, [tp if tp < 1.0 else math.inf for tp in top_ps])[:, None]
    vals.masked_fill_(cum - probs > p, -math.inf)
    return vals, idx, covered | (cum[:, -1:] > p).view(-1)


def _top_p_sorted(x: torch.Tensor, top_ps: list[float]) -> None:
    """Top-p over the whole vocabulary via one descending sort, in place (`[R, V]`)."""
    dev = x.device
    sorted_x, order = x.sort(dim=-1, descending=True)  # [R, V] each
    probs = sorted_x.softmax(dim=-1)
    p = _on(dev, [tp if tp < 1.0 else math.inf for tp in top_ps])[:, None]
    remove_sorted = probs.cumsum(dim=-1) - probs > p  # [R, V]
    remove = torch.empty_like(remove_sorted).scatter_(-1, order, remove_sorted)
    x.masked_fill_(remove, -math.inf)


def _min_p(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Min-p in place: p_i < min_p * p_max  <=>  x_i < x_max + log(min_p)."""
    if any(p.min_p > 0.0 for p in params):
        log_min_p = _on(x.device, [p.min_p for p in params]).log()[:, None]
        x.masked_fill_(x < x.amax(dim=-1, keepdim=True) + log_min_p, -math.inf)
    return x


def _cdf_draw(x: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One draw per row from softmax(x) by inverse CDF: `[R, W]` -> `[R]` positions.

    Consumes `x` (overwritten in place: on CPU a fresh `[R, V]` temporary costs more in
    page faults than the arithmetic). One uniform per row, not one per token, so it costs
    an exp, a cumsum and a binary search. Removed (-inf) positions weigh 0 and `u` stays
    below the total, so searchsorted's first cdf > u is a position of positive weight.
    """
    cdf = x.sub_(x.amax(dim=-1, keepdim=True)).exp_().cumsum_(dim=-1)  # [R, W]
    # A seeded row's generator lives on the host (Request makes it there): its uniforms
    # are drawn there and moved, so a seed gives the same draws on every device.
    where = gen.device if gen is not None else x.device
    u = to_device(torch.rand(x.shape[0], 1, generator=gen, device=where), x.device) * _BELOW_ONE
    pos = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).view(-1)  # [R]
    return pos.clamp_(max=x.shape[-1] - 1)


def _fill_logprobs(
    out: Draw,
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    rows: Sequence[SamplingRow],
    lp_rows: list[int],
) -> None:
    """Chosen-token and top logprobs for the rows that asked (see `Sampler` for which)."""
    chosen, tops = token_logprobs(
        _take(logits, lp_rows),
        token_ids[lp_rows],
        max(rows[i].params.top_logprobs_num for i in lp_rows),
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
    "Draw",
    "SampleOutput",
    "Sampler",
    "SamplingRow",
    "make_generator",
    "stop_token_set",
    "token_logprobs",
]
