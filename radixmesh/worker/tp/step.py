"""What rank 0 tells the other ranks each step, and how.

Host-side lists (token ids, rows, lengths, which hidden rows need logits) travel as one
pickled `StepHeader` over each follower's pipe: followers wait on a pipe, not a
collective, so an idle worker never trips the collective timeout and a dead rank 0
shows up as end-of-file. The device-side part (the new tokens' KV slots and the batch's
req->token rows) is one broadcast of a packed int64 tensor over the process group, so on
CUDA it never leaves the GPU: `[out_cache_loc (T) | req_to_token[req_rows, :L] (B * L)]`
with L the longest sequence of the step. Under overlap scheduling (worker/overlap.py) the
header's ids may be placeholders for tokens still on rank 0's device: then
`ids_on_device` is set and the broadcast starts with the step's resolved input ids (T).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import torch

from radixmesh.worker.batch import Batch
from radixmesh.worker.forward_batch import ForwardBatch, to_device
from radixmesh.worker.layers.parallel import TPGroup

STOP = b"stop"  # the shutdown message (a pickled header never equals it)


@dataclass(frozen=True)
class StepHeader:
    input_ids: list[int]  # [T]
    req_rows: list[int]  # [B]
    prefix_lens: list[int]  # [B]
    extend_lens: list[int]  # [B]
    logit_rows: list[int]  # hidden rows whose logits rank 0 computes (the LM head gathers)
    ids_on_device: bool = False  # the real input ids lead the broadcast (overlap)

    @classmethod
    def of(
        cls, batch: Batch, fb: ForwardBatch, logit_rows: list[int], ids_on_device: bool = False
    ) -> StepHeader:
        """Rank 0: the header of a scheduled batch (host lists only: no device sync)."""
        input_ids: list[int] = []
        for item, start in zip(batch.items, fb.prefix_lens_cpu, strict=True):
            if item.draft:  # speculative decoding: the last token, then its drafts
                input_ids.append(item.req.token_ids[start])
                input_ids.extend(item.draft)
            else:
                input_ids.extend(item.req.token_ids[start : start + item.num_new_tokens])
        req_rows: list[int] = [item.req.row for item in batch.items]  # type: ignore[misc]
        return cls(
            input_ids, req_rows, fb.prefix_lens_cpu, fb.extend_lens_cpu, logit_rows, ids_on_device
        )

    @property
    def max_len(self) -> int:
        return max(p + e for p, e in zip(self.prefix_lens, self.extend_lens, strict=True))

    def encode(self) -> bytes:
        fields = (self.input_ids, self.req_rows, self.prefix_lens, self.extend_lens)
        data = (*fields, self.logit_rows, self.ids_on_device)
        return pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def decode(cls, data: bytes) -> StepHeader:
        return cls(*pickle.loads(data))


def send_tables(
    tp: TPGroup,
    header: StepHeader,
    out_cache_loc: torch.Tensor,
    req_rows: torch.Tensor,
    req_to_token: torch.Tensor,
    input_ids: torch.Tensor | None = None,
) -> None:
    """Rank 0: broadcast the step's KV slots and table rows (see the module docstring),
    after the resolved input ids when the header says `ids_on_device`."""
    rows = req_to_token.index_select(0, req_rows)[:, : header.max_len]  # [B, L]
    parts = [out_cache_loc.to(torch.int64), rows.reshape(-1).to(torch.int64)]
    if header.ids_on_device:
        assert input_ids is not None
        parts.insert(0, input_ids.to(torch.int64))
    tp.broadcast(torch.cat(parts), src=0)


def receive_tables(
    tp: TPGroup, header: StepHeader, req_to_token: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Other ranks: receive the broadcast, write the rows into this rank's req->token
    table (so the attention backends and CUDA graphs read it as on rank 0) and return
    out_cache_loc [T] and, with `ids_on_device`, the input ids [T] (else None)."""
    t, b, n = len(header.input_ids), len(header.req_rows), header.max_len
    ids = t if header.ids_on_device else 0
    packed = torch.empty(ids + t + b * n, dtype=torch.int64, device=req_to_token.device)
    tp.broadcast(packed, src=0)
    # Not a blocking copy: on CUDA that would wait for this rank's previous step.
    rows = to_device(torch.tensor(header.req_rows, dtype=torch.int64), req_to_token.device)
    req_to_token[rows, :n] = packed[ids + t :].view(b, n).to(req_to_token.dtype)
    return packed[ids : ids + t], (packed[:t] if ids else None)
