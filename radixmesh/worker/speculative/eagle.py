"""Drafts from an EAGLE head (eagle_head.py) over the target model's own features.

The runner hands back the target's final hidden rows of every position it computes for a
request that may draft, in a step that may draft (`ForwardOutput.features`; a larger
batch's step copies none); the scheduler passes on those the request keeps (`observe`:
a verify row's accepted positions only, as with its KV slots).
Each request's state here is its features not yet fed to the head, and the head's keys
and values for the positions it has processed (its own KV: the head attends over its
earlier positions). A draft first feeds the pending features (one head forward over
them, keys kept), then runs k single-position steps, each feeding back its own output
feature and greedy token; those steps' keys are dropped after the draft, so the head's
history only ever holds positions computed from the target's features.

Positions the target never computed for this request (a radix-cache hit on the prompt)
have no features: they are absent from the head's history, and rotary still uses the
real positions. Drafts may then be worse, never wrong: verification is the target's.

The state is keyed weakly by request and dropped as soon as the request has finished
(or was aborted), or while more requests run than may draft (the speculator's
`speculative_max_batch_size`: `forget_all`). Held outside the KV pool, and bounded per
request: pending features (hidden_size values a token) until the next draft, at most
`MAX_PENDING` positions (the oldest dropped), and the head's K/V (2 x kv heads x head_dim
a token), at most `MAX_HISTORY` positions (a sliding window: the oldest dropped). So at
most speculative_max_batch_size x (MAX_PENDING x hidden + MAX_HISTORY x 2 x kv heads x
head_dim) values: 16 x (2,048 x 4,096 + 8,192 x 2,048) x 2 bytes = 0.8 GB at Llama-3-8B's
sizes in bf16, whatever the context length. Positions dropped either way are absent from
the head's history: drafts may be worse, never wrong.
All requests of a step draft together: one head forward feeds their pending features
(up to BATCHED_FEED positions each, padded; a longer feed, after a prompt chunk, runs
alone), then each draft position is one forward for every request, over their histories
padded into one tensor with room for the draft's keys (`EagleHead.forward_batch`).
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from radixmesh.worker.model.llama import LlamaForCausalLM
from radixmesh.worker.request import Request
from radixmesh.worker.speculative.eagle_head import EagleHead

MAX_PENDING = 2048  # features kept per request until its next draft (one prefill chunk's)
MAX_HISTORY = 8192  # the head's K/V positions kept per request
# Pending positions fed in one batched head forward; a longer feed (after a prompt chunk)
# runs alone, so that padding every request to it costs no memory.
BATCHED_FEED = 64


_Feed = tuple[list[int], torch.Tensor, list[int]]  # next tokens, features [n, H], positions


@dataclass
class _State:
    keys: torch.Tensor  # [P, Hkv, D]: the head's history, rotated
    values: torch.Tensor  # [P, Hkv, D]
    positions: list[int] = field(default_factory=list)  # [P], increasing
    pending: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (first, [n, H])
    last: torch.Tensor | None = None  # the head's output at positions[-1], [H]


class EagleDrafter:
    def __init__(self, head: EagleHead, target: LlamaForCausalLM) -> None:
        self.head = head
        self.target = target
        attn = head.layer.self_attn
        self._kv_shape = (0, attn.num_kv_heads, attn.head_dim)
        self._states: weakref.WeakKeyDictionary[Request, _State] = weakref.WeakKeyDictionary()

    def observe(self, req: Request, start: int, features: torch.Tensor) -> None:
        """The target's features [n, H] of positions start .. start + n - 1 of `req`, just
        computed. Anything kept for positions >= start is stale (recomputed after a
        retraction or a trimmed row): dropped first."""
        if req.finish_reason is not None:
            self._states.pop(req, None)
            return
        state = self._states.get(req)
        if state is None:
            empty = features.new_empty(self._kv_shape)
            state = self._states[req] = _State(keys=empty, values=empty)
        cut = bisect.bisect_left(state.positions, start)
        if cut < len(state.positions):
            state.keys, state.values = state.keys[:cut], state.values[:cut]
            del state.positions[cut:]
            state.last = None
        state.pending = [
            (first, rows[: start - first]) for first, rows in state.pending if first < start
        ]
        drop = max(0, len(features) - MAX_PENDING)  # a long chunk's first positions: none
        state.pending.append((start + drop, features[drop:]))
        while sum(len(rows) for _, rows in state.pending) > MAX_PENDING:
            state.pending.pop(0)

    def forget_all(self) -> None:
        """Drop every request's state (a step too large to draft: no features come)."""
        if self._states:
            self._states.clear()

    def propose(self, req: Request, k: int) -> list[int]:
        return self.propose_all([(req, k)]).get(req, [])

    @torch.inference_mode()
    def propose_all(self, wanted: Sequence[tuple[Request, int]]) -> dict[Request, list[int]]:
        """Every request's k drafts in one batch: the pending features fed in one head
        forward (those of up to BATCHED_FEED positions; longer feeds, after a prompt
        chunk, one request at a time), then each draft position one forward for all."""
        for req in [r for r in self._states if r.finish_reason is not None]:
            del self._states[req]
        ready = [(req, s, k) for req, k in wanted if k > 0 and (s := self._states.get(req))]
        feeds = [(s, f) for req, s, _ in ready if (f := self._pending(req, s)) is not None]
        short = [f for f in feeds if len(f[1][2]) <= BATCHED_FEED]
        for group in [short] + [[f] for f in feeds if len(f[1][2]) > BATCHED_FEED]:
            if group:
                self._feed(group)
        live = [
            (req, s, k)
            for req, s, k in ready
            if s.last is not None and s.positions and s.positions[-1] == len(req.token_ids) - 2
        ]  # the others have no feature for the position before their last token
        if not live:
            return {}
        drafts = self._draft(live)
        return {req: d for (req, _, _), d in zip(live, drafts, strict=True)}

    def _pending(self, req: Request, state: _State) -> _Feed | None:
        """(next tokens, features [n, H], positions) of the pending positions < limit
        (their next token is on the host), taken off the state; None if there are none."""
        ids = req.token_ids
        limit = min(req.num_computed_tokens, len(ids) - 1)
        rows: list[torch.Tensor] = []
        positions: list[int] = []
        for first, feats in state.pending:
            n = max(0, min(len(feats), limit - first))
            rows.append(feats[:n])
            positions.extend(range(first, first + n))
        state.pending = []
        if not positions:
            return None
        return [ids[p + 1] for p in positions], torch.cat(rows), positions

    def _feed(self, group: list[tuple[_State, _Feed]]) -> None:
        """The groups' pending positions through the head, one forward; their keys join
        each history and the last output becomes the state's `last`."""
        states = [s for s, _ in group]
        lens = [len(positions) for _, (_, _, positions) in group]
        t = max(lens)
        tokens = [tok + [0] * (t - len(tok)) for _, (tok, _, _) in group]
        positions = [pos + [pos[-1]] * (t - len(pos)) for _, (_, _, pos) in group]
        feats = [f for _, (_, f, _) in group]
        features = torch.stack([F.pad(f, (0, 0, 0, t - len(f))) for f in feats])  # [B, T, H]
        past_k, past_v, past_lens = self._histories(states, 0)
        h, k, v = self._forward(tokens, features, positions, past_k, past_v, past_lens)
        for i, (state, n) in enumerate(zip(states, lens, strict=True)):
            state.keys = torch.cat((state.keys, k[i, :n]))[-MAX_HISTORY:]
            state.values = torch.cat((state.values, v[i, :n]))[-MAX_HISTORY:]
            state.positions.extend(positions[i][:n])
            del state.positions[:-MAX_HISTORY]
            state.last = h[i, n - 1]

    def _draft(self, live: list[tuple[Request, _State, int]]) -> list[list[int]]:
        """k greedy tokens per request, one head forward per draft position for all: each
        step's keys go into room after each history (the states keep none of them)."""
        states = [s for _, s, _ in live]
        ks = [k for _, _, k in live]
        most = max(ks)
        past_k, past_v, past_lens = self._histories(states, most - 1)
        h = torch.stack([s.last for s in states if s.last is not None])  # [B, H]
        pos = [len(req.token_ids) - 2 for req, _, _ in live]
        rows = torch.arange(len(live), device=h.device)
        equal = min(past_lens) == max(past_lens)  # batch 1 always: slices, no masks
        at = torch.tensor(past_lens, device=h.device)
        drafts: list[list[int]] = [[] for _ in live]
        for step in range(most):
            tokens = self.target.compute_logits(h).argmax(dim=-1).tolist()
            for draft, k, token in zip(drafts, ks, tokens, strict=True):
                if step < k:
                    draft.append(token)
            if step == most - 1:
                return drafts
            pos = [p + 1 for p in pos]
            n = past_lens[0]
            if equal:
                ks_, vs_, lens = past_k[:, :n], past_v[:, :n], None
            else:
                ks_, vs_, lens = past_k, past_v, past_lens
            out, key, value = self._forward(
                [[tok] for tok in tokens], h[:, None], [[p] for p in pos], ks_, vs_, lens
            )
            if equal:
                past_k[:, n], past_v[:, n] = key[:, 0], value[:, 0]
            else:
                past_k[rows, at], past_v[rows, at] = key[:, 0], value[:, 0]
                at = at + 1
            past_lens = [x + 1 for x in past_lens]
            h = out[:, 0]
        return drafts

    def _histories(
        self, states: list[_State], room: int
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The states' keys and values padded into [B, P + room, Hkv, D] (P the longest
        history), and each history's length."""
        lens = [len(s.keys) for s in states]
        width = max(lens) + room
        first = states[0].keys
        past_k = first.new_zeros((len(states), width, *first.shape[1:]))
        past_v = torch.zeros_like(past_k)
        for i, (s, n) in enumerate(zip(states, lens, strict=True)):
            past_k[i, :n] = s.keys
            past_v[i, :n] = s.values
        return past_k, past_v, lens

    def _forward(
        self,
        tokens: list[list[int]],
        features: torch.Tensor,
        positions: list[list[int]],
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        past_lens: list[int] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The head over [B, T] new positions after each row's history."""
        device = features.device
        ids = torch.tensor(tokens, dtype=torch.int64, device=device)
        at = torch.tensor(positions, dtype=torch.int64, device=device)
        embeds = self.target.model.embed_tokens(ids.reshape(-1)).view(*ids.shape, -1)
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = self.head.forward_batch(
            embeds, features, at, past_k, past_v, past_lens
        )
        return out
