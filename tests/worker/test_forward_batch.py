"""ForwardBatch.build: one packed copy of a step's inputs, its layout on the device, the
decode block a CUDA graph copies at once, and the ints carried with it."""

from __future__ import annotations

import numpy as np
import torch

from radixmesh.worker.forward_batch import ForwardBatch

TABLE = torch.zeros(4, 32, dtype=torch.int64)


def _fields(fb: ForwardBatch) -> dict[str, list[int]]:
    return {
        "input_ids": fb.input_ids.tolist(),
        "positions": fb.positions.tolist(),
        "out_cache_loc": fb.out_cache_loc.tolist(),
        "req_rows": fb.req_rows.tolist(),
        "seq_lens": fb.seq_lens.tolist(),
        "prefix_lens": fb.prefix_lens.tolist(),
        "extend_lens": fb.extend_lens.tolist(),
    }


def test_a_decode_batch_with_packed_slots_is_one_block() -> None:
    fb = ForwardBatch.build(
        input_ids=[11, 12, 13],
        out_cache_loc=torch.tensor([7, 8, 9], dtype=torch.int32),
        req_rows=[2, 0, 3],
        prefix_lens=[5, 9, 1],
        extend_lens=[1, 1, 1],
        req_to_token=TABLE,
        pack_slots=True,  # the default where the device is not the CPU
    )
    assert _fields(fb) == {
        "input_ids": [11, 12, 13],
        "positions": [5, 9, 1],
        "out_cache_loc": [7, 8, 9],
        "req_rows": [2, 0, 3],
        "seq_lens": [6, 10, 2],
        "prefix_lens": [5, 9, 1],
        "extend_lens": [1, 1, 1],
    }
    assert fb.decode_inputs is not None
    assert fb.decode_inputs.tolist() == [[7, 8, 9], [11, 12, 13], [5, 9, 1], [2, 0, 3], [6, 10, 2]]
    assert (fb.seq_lens_cpu, fb.prefix_lens_cpu, fb.req_rows_cpu) == (
        [6, 10, 2],
        [5, 9, 1],
        [2, 0, 3],
    )
    assert fb.carried is None and fb.is_decode_only and fb.out_cache_loc.dtype == torch.int64


def test_on_the_cpu_the_slots_are_used_as_they_are() -> None:
    loc = torch.tensor([7, 8])
    fb = ForwardBatch.build(
        input_ids=[1, 2],
        out_cache_loc=loc,
        req_rows=[0, 1],
        prefix_lens=[3, 4],
        extend_lens=[1, 1],
        req_to_token=TABLE,
    )
    assert fb.out_cache_loc is loc and fb.decode_inputs is None
    assert fb.input_ids.tolist() == [1, 2] and fb.seq_lens.tolist() == [4, 5]


def test_an_extend_batch_and_the_carried_ints() -> None:
    carry = np.array([40, 41, 3, 4], dtype=np.int64)  # e.g. two staged table writes
    fb = ForwardBatch.build(
        input_ids=[1, 2, 3, 4],
        out_cache_loc=torch.tensor([20, 21, 22, 23]),
        req_rows=[1, 0],
        prefix_lens=[6, 0],
        extend_lens=[3, 1],
        req_to_token=TABLE,
        carry=carry,
        pack_slots=True,
    )
    assert _fields(fb) == {
        "input_ids": [1, 2, 3, 4],
        "positions": [6, 7, 8, 0],
        "out_cache_loc": [20, 21, 22, 23],
        "req_rows": [1, 0],
        "seq_lens": [9, 1],
        "prefix_lens": [6, 0],
        "extend_lens": [3, 1],
    }
    assert fb.decode_inputs is None and not fb.is_decode_only
    assert fb.carried is not None and fb.carried.tolist() == [40, 41, 3, 4]


def test_slots_already_on_the_device_are_not_packed() -> None:
    loc = torch.tensor([3, 4], dtype=torch.int32, device="meta")  # stands for another device
    fb = ForwardBatch.build(
        input_ids=[5, 6],
        out_cache_loc=loc,
        req_rows=[0, 1],
        prefix_lens=[2, 3],
        extend_lens=[1, 1],
        req_to_token=torch.zeros(2, 8, dtype=torch.int64, device="meta"),
    )
    assert fb.decode_inputs is None
    assert fb.out_cache_loc.device.type == "meta" and fb.out_cache_loc.dtype == torch.int64
    assert fb.input_ids.shape == (2,) and fb.seq_lens_cpu == [3, 4]
