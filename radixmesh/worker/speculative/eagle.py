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
Requests draft one after another (one head forward each, then k - 1 per step); a
batched head forward over padded histories is not built yet.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from radixmesh.worker.model.llama import LlamaForCausalLM
from radixmesh.worker.request import Request
from radixmesh.worker.speculative.eagle_head import EagleHead

MAX_PENDING = 2048  # features kept per request until its next draft (one prefill chunk's)
MAX_HISTORY = 8192  # the head's K/V positions kept per request


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
        for req in [r for r in self._states if r.finish_reason is not None]:
            del self._states[req]
        out: dict[Request, list[int]] = {}
        for req, k in wanted:
            draft = self._draft(req, k)
            if draft:
                out[req] = draft
        return out

    def _draft(self, req: Request, k: int) -> list[int]:
        state = self._states.get(req)
        if state is None:
            return []
        ids = req.token_ids
        self._feed(state, ids, min(req.num_computed_tokens, len(ids) - 1))
        if state.last is None or not state.positions or state.positions[-1] != len(ids) - 2:
            return []  # no feature for the position before the last token
        h, pos = state.last.unsqueeze(0), len(ids) - 2  # [1, H]
        keys, values = state.keys, state.values
        draft: list[int] = []
        while True:
            draft.append(int(self.target.compute_logits(h).argmax(dim=-1)[0]))
            if len(draft) == k:
                return draft
            pos += 1
            h, key, value = self._step([draft[-1]], h, [pos], keys, values)
            keys, values = torch.cat((keys, key)), torch.cat((values, value))

    def _feed(self, state: _State, ids: list[int], limit: int) -> None:
        """The pending features of positions < limit (their next token is on the host)
        through the head; their keys join the history."""
        rows: list[torch.Tensor] = []
        positions: list[int] = []
        for first, feats in state.pending:
            n = max(0, min(len(feats), limit - first))
            rows.append(feats[:n])
            positions.extend(range(first, first + n))
        state.pending = []
        if not positions:
            return
        tokens = [ids[p + 1] for p in positions]
        h, key, value = self._step(tokens, torch.cat(rows), positions, state.keys, state.values)
        state.keys = torch.cat((state.keys, key))[-MAX_HISTORY:]
        state.values = torch.cat((state.values, value))[-MAX_HISTORY:]
        state.positions.extend(positions)
        del state.positions[:-MAX_HISTORY]
        state.last = h[-1]

    def _step(
        self,
        tokens: list[int],
        features: torch.Tensor,
        positions: list[int],
        past_k: torch.Tensor,
        past_v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The head over new positions after (past_k, past_v): (h, their keys, values)."""
        device = features.device
        ids = torch.tensor(tokens, dtype=torch.int64, device=device)
        at = torch.tensor(positions, dtype=torch.int64, device=device)
        embeds = self.target.model.embed_tokens(ids)  # [T, H]
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = self.head(
            embeds, features, at, past_k, past_v
        )
        return out
