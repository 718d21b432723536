"""Token bitmasks: one int32 tensor per step for the constrained rows of a batch.

Layout (shared with the backends): `[M, ceil(V / 32)]` int32, bit `t % 32` of word
`t // 32` set when token `t` is allowed. Unpacking goes through a byte lookup table
(`[256, 8]` bool): one gather of `M * V / 8` bytes, instead of 32 shifts per word.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixmesh.worker.forward_batch import to_device

_LUT: dict[torch.device, torch.Tensor] = {}


def num_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int, *, pin: bool = False) -> torch.Tensor:
    """`[rows, ceil(V / 32)]` int32 on the host, every token allowed; `pin`: in pinned
    memory (needs CUDA), so that a non-blocking copy to the GPU is asynchronous."""
    shape = (rows, num_words(vocab_size))
    return torch.full(shape, -1, dtype=torch.int32, pin_memory=pin)


def _byte_table(device: torch.device) -> torch.Tensor:
    """`[256, 8]` bool: bit k of byte b (little-endian bit order within a byte)."""
    lut = _LUT.get(device)
    if lut is None:
        b = torch.arange(256, dtype=torch.int32)
        lut = ((b[:, None] >> torch.arange(8, dtype=torch.int32)) & 1).bool().to(device)
        _LUT[device] = lut
    return lut


def unpack_bitmask(bits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`[M, W]` int32 -> `[M, vocab_size]` bool (True = allowed)."""
    m = bits.shape[0]
    as_bytes = bits.contiguous().view(torch.uint8).long()  # [M, 4W], little-endian words
    allowed = _byte_table(bits.device)[as_bytes]  # [M, 4W, 8]
    return allowed.view(m, -1)[:, :vocab_size]


@dataclass
class TokenBitmask:
    """The allowed tokens of some rows of a `[N, V]` logits tensor.

    `bits[j]` belongs to logits row `rows[j]` (ascending); rows not listed are unconstrained
    and untouched.
    """

    bits: torch.Tensor  # [M, W] int32
    rows: list[int]  # [M]

    def apply_(self, logits: torch.Tensor) -> None:
        """Set disallowed logits of the listed rows to -inf, in place (`[N, V]` float)."""
        v = logits.shape[-1]
        bits = self.bits.to(logits.device, non_blocking=True)
        banned = ~unpack_bitmask(bits, v)  # [M, V]
        if len(self.rows) == logits.shape[0]:
            logits.masked_fill_(banned, -math.inf)
            return
        # Through pinned memory: a pageable copy would wait for the forward on CUDA.
        index = to_device(torch.tensor(self.rows, dtype=torch.long), logits.device)
        sub = logits.index_select(0, index).masked_fill_(banned, -math.inf)
        logits.index_copy_(0, index, sub)
