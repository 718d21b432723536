"""An embedding request's pooled hidden states: chunk by chunk, once per position."""

from __future__ import annotations

import torch

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.batch import ScheduledRequest
from radixmesh.worker.model_runner import _pooled
from radixmesh.worker.request import HiddenPool, Pooling, Request


def embed_request(n: int, pooling: Pooling) -> Request:
    req = Request(rid="e", prompt_ids=list(range(n)), params=SamplingParams(max_new_tokens=0))
    req.hidden_pool = HiddenPool(pooling)
    return req


def step(req: Request, hidden: torch.Tensor, start: int, num: int) -> None:
    """One step computing positions start.. start + num of `req` (hidden: every position's)."""
    req.num_computed_tokens = start
    (pooled,) = _pooled([ScheduledRequest(req, num)], hidden[start : start + num])
    if pooled is not None:
        assert req.hidden_pool is not None
        req.hidden_pool.add(pooled.first, pooled.count, pooled.value)


def test_mean_over_chunks_counts_each_position_once() -> None:
    hidden = torch.randn(10, 6)
    req = embed_request(10, Pooling.MEAN)
    assert req.max_prefix_match() == 0  # every position is computed, none from the cache
    step(req, hidden, 0, 4)
    step(req, hidden, 0, 7)  # retracted, recomputed from the start: 0..3 not again
    step(req, hidden, 7, 3)
    assert req.hidden_pool is not None and req.hidden_pool.count == 10
    assert torch.allclose(torch.tensor(req.hidden_pool.vector()), hidden.mean(dim=0), atol=1e-6)


def test_last_takes_the_final_position() -> None:
    hidden = torch.randn(5, 3)
    req = embed_request(5, Pooling.LAST)
    assert req.max_prefix_match() == 4  # a cached prefix is fine: only the end is needed
    step(req, hidden, 0, 3)
    assert req.hidden_pool is not None and req.hidden_pool.total is None
    step(req, hidden, 3, 2)
    assert req.hidden_pool.vector() == hidden[-1].tolist()


def test_other_requests_pool_nothing() -> None:
    req = Request(rid="g", prompt_ids=[1, 2, 3], params=SamplingParams())
    assert _pooled([ScheduledRequest(req, 3)], torch.randn(3, 4)) == [None]
