from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker import sampler as sampler_module
from radixmesh.worker.sampler import (
    Sampler,
    SamplingRow,
    _window_filter,
    all_plain_greedy,
    make_generator,
    plain_greedy_params,
    stop_token_set,
    token_logprobs,
)


def row(
    prompt: Sequence[int] = (),
    output: Sequence[int] = (),
    stop_ids: Sequence[int] = (),
    **params: object,
) -> SamplingRow:
    p = SamplingParams(**params)  # type: ignore[arg-type]
    gen = make_generator(p.seed) if p.seed is not None else None
    return SamplingRow(p, list(prompt), list(output), frozenset(stop_ids), gen)


def many(n: int, **params: Any) -> list[SamplingRow]:
    return [row(**params) for _ in range(n)]


def draws(logits_row: torch.Tensor, n: int, **params: Any) -> torch.Tensor:
    """`[n]` tokens drawn for n copies of one `[V]` logits row in one batch."""
    sampler = Sampler(logits_row.shape[-1])
    logits = logits_row.expand(n, -1).contiguous()
    return torch.tensor(sampler.sample(logits, many(n, **params)).token_ids)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_greedy_equals_argmax() -> None:
    logits = torch.randn(7, 50)
    out = Sampler(50).sample(logits, many(7, temperature=0.0))
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs is None and out.top_logprobs is None


def test_top_k_1_equals_greedy() -> None:
    logits = torch.randn(7, 50)
    out = Sampler(50).sample(logits, many(7, top_k=1, temperature=1.3))
    assert out.token_ids == logits.argmax(-1).tolist()


def test_greedy_ignores_padded_vocab_columns() -> None:
    logits = torch.zeros(2, 12)
    logits[:, 11] = 100.0  # padding column past the real vocabulary
    logits[0, 3] = 1.0
    logits[1, 5] = 1.0
    assert Sampler(10).sample(logits, many(2, temperature=0.0)).token_ids == [3, 5]
    assert all(t < 10 for t in Sampler(10).sample(logits, many(2)).token_ids)


def test_logits_not_modified() -> None:
    logits = torch.randn(3, 20)
    before = logits.clone()
    rows = [
        row(output=[1, 2], repetition_penalty=1.5, temperature=0.5, top_p=0.5),
        row(output=[], stop_ids=[3], min_new_tokens=2),
        row(temperature=0.0, return_logprob=True),
    ]
    Sampler(20).sample(logits, rows, vocab_mask=torch.ones(3, 20, dtype=torch.bool))
    assert torch.equal(logits, before)


def test_seeded_sampling_reproducible_and_batch_independent() -> None:
    v, steps = 64, 20
    gen_logits = torch.Generator().manual_seed(123)
    seq = [torch.randn(v, generator=gen_logits) * 2 for _ in range(steps)]
    others_logits = [torch.randn(4, v, generator=gen_logits) for _ in range(steps)]
    sampler = Sampler(v)
    params: dict[str, Any] = dict(seed=42, temperature=0.9, top_p=0.9)

    def run_alone() -> list[int]:
        r = row(**params)
        return [sampler.sample(seq[s][None], [r]).token_ids[0] for s in range(steps)]

    def run_batched() -> list[int]:
        r = row(**params)
        others = [row(), row(temperature=0.0), row(top_k=5), row(seed=7, min_p=0.1)]
        out = []
        for s in range(steps):
            logits = torch.cat([others_logits[s][:2], seq[s][None], others_logits[s][2:]])
            out.append(sampler.sample(logits, [*others[:2], r, *others[2:]]).token_ids[2])
        return out

    alone = run_alone()
    assert run_alone() == alone
    assert run_batched() == alone
    assert len(set(alone)) > 1  # actually random, not collapsed to argmax


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_seeded_rows_on_cuda_logits_repeat() -> None:
    """A request's generator is a host one: seeded rows of CUDA logits draw from it (a
    CUDA draw with a host generator is an error) and repeat."""
    v = 64
    logits = (torch.randn(3, v, generator=torch.Generator().manual_seed(3)) * 2).cuda()
    sampler = Sampler(v)

    def run() -> list[int]:
        rows = [row(seed=42, temperature=0.9), row(), row(seed=7, top_p=0.9, top_k=10)]
        return [t for _ in range(10) for t in sampler.sample(logits, rows).token_ids[::2]]

    first = run()
    assert run() == first and len(set(first)) > 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_top_k_rows_draw_without_waiting_for_the_device() -> None:
    """Rows whose window is decided on the host (top-k, greedy, plain temperature) and a
    few top-p rows (sorted) draw with no stream synchronization, so the overlap
    scheduler can queue the next step behind their draw (worker/overlap.py)."""
    v = 300
    logits = (torch.randn(7, v, generator=torch.Generator().manual_seed(5)) * 3).cuda()
    sampler = Sampler(v)
    rows = [
        row(temperature=0.8, top_k=40),
        row(temperature=0.0),
        row(temperature=1.1, top_k=20, top_p=0.8, min_p=0.05),
        row(seed=9, temperature=0.7, top_k=10, logit_bias=((3, 4.0),)),
        row(temperature=1.0),
        row(temperature=0.9, top_p=0.9),  # one of a few top-p rows: sorted, not read
        row(seed=4, temperature=0.6, top_p=0.5),
    ]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids = sampler.draw(logits, rows).token_ids
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ids.shape == (7,) and ids.device.type == "cuda"
    assert ids[1].item() == int(logits[1].argmax())


def test_different_seeds_differ() -> None:
    logits = torch.zeros(1, 1000)
    sampler = Sampler(1000)
    a, b = row(seed=1), row(seed=2)
    assert [sampler.sample(logits, [a]).token_ids[0] for _ in range(3)] != [
        sampler.sample(logits, [b]).token_ids[0] for _ in range(3)
    ]


def test_top_k_stays_in_allowed_set() -> None:
    logits = torch.tensor([0.5, 3.0, -1.0, 2.0, 2.5, 0.0, 1.0, -2.0])
    tokens = draws(logits, 4000, top_k=3)
    assert set(tokens.tolist()) == {1, 3, 4}


def test_top_p_stays_in_allowed_set() -> None:
    probs = torch.tensor([0.05, 0.4, 0.02, 0.3, 0.1, 0.13])
    # Descending: 0.4, 0.3, 0.13 | 0.1 ... -> mass 0.83 >= 0.8 after three tokens.
    tokens = draws(probs.log(), 4000, top_p=0.8)
    assert set(tokens.tolist()) == {1, 3, 5}


def test_top_p_1_keeps_whole_top_k_window() -> None:
    # A float cumsum over 40000 probabilities passes 1.0 before the end; top_p=1 must
    # still keep all of the top-k set.
    x = torch.randn(2, 49152) * 3
    vals, _, covered = _window_filter(x, [40000, 40000], [1.0, 0.5], 256)
    assert torch.isfinite(vals[0]).sum() == 40000
    assert torch.isfinite(vals[1]).sum() < 40000
    assert covered.tolist() == [True, True]


def _top_p_allowed(logits: torch.Tensor, p: float) -> int:
    """How many of the (descending) logits top-p keeps, computed in float64."""
    probs = torch.softmax(logits.double(), -1)
    return int(((probs.cumsum(-1) - probs) <= p).sum())


def test_top_p_decided_in_window() -> None:
    # 3000 tokens: 20 likely ones hold ~0.99 of the mass, so the top-256 window decides.
    logits = torch.cat([torch.linspace(8.0, 6.0, 20), torch.linspace(0.0, -1.0, 2980)])
    m = _top_p_allowed(logits, 0.9)
    assert 5 < m < 20
    tokens = draws(logits, 3000, top_p=0.9)
    assert set(tokens.tolist()) == set(range(m))


def test_top_p_beyond_windows_falls_back_to_full_sort() -> None:
    # Nearly flat over 6000 tokens: the top 4096 hold ~70% of the mass, top_p=0.9 ~5400.
    logits = torch.linspace(0.0, -0.5, 6000)
    m = _top_p_allowed(logits, 0.9)
    assert m > 5000
    tokens = draws(logits, 2000, top_p=0.9)
    assert int(tokens.max()) < m
    assert int(tokens.max()) > m - 100  # the tail of the kept set is reachable
    assert len(set(tokens.tolist())) > 1000


def test_a_few_top_p_rows_sorted_keep_the_windows_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The full-sort path that a few top-p rows take on CUDA (no read back of a window's
    coverage) draws from the same nucleus with the same probabilities as the windows:
    a chi-square test over 6,000 draws of each, 6 rows a call."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    m = _top_p_allowed(logits, 0.85)
    assert m == 4
    probs = torch.softmax(logits[:m].double(), -1)

    def sample(sorted_path: bool) -> torch.Tensor:
        on = ("cpu", "cuda") if sorted_path else ("cuda",)
        monkeypatch.setattr(sampler_module, "_SORT_TOP_P_ON", on)
        got = [draws(logits, 6, top_p=0.85, temperature=1.0) for _ in range(1000)]
        return torch.cat(got)

    for tokens in (sample(True), sample(False)):
        assert set(tokens.tolist()) == set(range(m))
        counts = torch.bincount(tokens, minlength=m).double()
        expected = probs * tokens.numel()
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 16.3  # 3 degrees of freedom: p < 0.001


def test_top_p_decided_in_second_window() -> None:
    # 2000 nearly flat tokens, then a very unlikely tail: the top 256 hold ~13%, the top
    # 4096 everything that top_p=0.9 keeps.
    logits = torch.cat([torch.linspace(0.0, -0.5, 2000), torch.full((8000,), -30.0)])
    m = _top_p_allowed(logits, 0.9)
    assert 1500 < m < 2000
    tokens = draws(logits, 2000, top_p=0.9)
    assert int(tokens.max()) < m
    assert int(tokens.max()) > m - 40


def test_top_k_beyond_default_window() -> None:
    logits = torch.linspace(0.0, -0.1, 1000)
    tokens = draws(logits, 3000, top_k=400)
    assert set(tokens.tolist()) <= set(range(400))
    assert int(tokens.max()) > 390


def test_top_k_then_top_p_renormalizes() -> None:
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    # top_k=2 leaves (0.4, 0.3) -> renormalized (0.571, 0.429); top_p=0.5 keeps only 0.
    tokens = draws(probs.log(), 2000, top_k=2, top_p=0.5)
    assert set(tokens.tolist()) == {0}


def test_min_p_stays_in_allowed_set() -> None:
    probs = torch.tensor([0.5, 0.2, 0.26, 0.04])
    # min_p 0.5 -> keep p >= 0.25: tokens 0 and 2.
    tokens = draws(probs.log(), 4000, min_p=0.5)
    assert set(tokens.tolist()) == {0, 2}


def test_mixed_batch_filters_apply_per_row() -> None:
    logits = torch.arange(10, dtype=torch.float32).expand(4, -1).contiguous()  # 9 is best
    rows = [row(top_k=2), row(top_p=0.5), row(), row(temperature=0.0)]
    sampler = Sampler(10)
    seen: list[set[int]] = [set(), set(), set(), set()]
    for _ in range(500):
        for i, t in enumerate(sampler.sample(logits, rows).token_ids):
            seen[i].add(t)
    assert seen[0] == {8, 9}
    assert seen[1] == {9}  # p(9) = 0.63 >= 0.5
    assert len(seen[2]) > 3
    assert seen[3] == {9}


def test_temperature_distribution() -> None:
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0])
    n = 40000
    for temp in (0.5, 1.0, 2.0):
        tokens = draws(logits, n, temperature=temp)
        freq = torch.bincount(tokens, minlength=5).float() / n
        expected = torch.softmax(logits / temp, dim=-1)
        assert torch.allclose(freq, expected, atol=0.012), (temp, freq, expected)


def test_seeded_distribution_matches_softmax() -> None:
    logits = torch.tensor([[1.0, 0.0, -1.0]])
    sampler = Sampler(3)
    r = row(seed=5)
    tokens = torch.tensor([sampler.sample(logits, [r]).token_ids[0] for _ in range(6000)])
    freq = torch.bincount(tokens, minlength=3).float() / 6000
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.02)


def _penalized_logits(logits: torch.Tensor, r: SamplingRow) -> torch.Tensor:
    # Logprobs are log_softmax of the penalized logits; shift-invariance lets us compare.
    out = Sampler(logits.shape[-1]).sample(logits[None], [r])
    assert out.top_logprobs is not None
    pairs = sorted(out.top_logprobs[0])
    return torch.tensor([lp for _, lp in pairs])


def test_repetition_penalty_formula() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 0.0])
    r = row(
        prompt=[0, 1],
        output=[3],
        repetition_penalty=2.0,
        temperature=0.0,
        return_logprob=True,
        top_logprobs_num=6,
    )
    expected = torch.tensor([1.0, -2.0, 0.5, -6.0, 1.0, 0.0])  # /2 if > 0, *2 if < 0
    got = _penalized_logits(logits, r)
    assert torch.allclose(got, torch.log_softmax(expected, -1), atol=1e-6)


def test_frequency_and_presence_penalty_formula() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 0.0])
    r = row(
        prompt=[4, 4, 5],
        output=[0, 0, 0, 2, 3, 3],
        frequency_penalty=0.5,
        presence_penalty=0.25,
        temperature=0.0,
        return_logprob=True,
        top_logprobs_num=6,
    )
    counts = torch.tensor([3.0, 0, 1, 2, 0, 0])  # output only: prompt tokens 4, 5 untouched
    expected = logits - 0.5 * counts - 0.25 * (counts > 0).float()
    got = _penalized_logits(logits, r)
    assert torch.allclose(got, torch.log_softmax(expected, -1), atol=1e-6)


def test_all_penalties_combined_and_rows_independent() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0], [1.0, 1.0, 1.0, 1.0]])
    rows = [
        row(
            prompt=[1],
            output=[0, 0],
            repetition_penalty=1.25,
            frequency_penalty=-0.5,
            presence_penalty=1.0,
            temperature=0.0,
            return_logprob=True,
            top_logprobs_num=4,
        ),
        row(output=[0, 1, 2], temperature=0.0, return_logprob=True, top_logprobs_num=4),
    ]
    out = Sampler(4).sample(logits, rows)
    assert out.top_logprobs is not None
    # Row 0: rep (2/1.25=1.6, -1*1.25=-1.25), then freq -(-0.5*2) = +1, pres -1 on token 0.
    expected0 = torch.tensor([1.6 + 1.0 - 1.0, -1.25, 0.5, -3.0])
    got0 = torch.tensor([lp for _, lp in sorted(out.top_logprobs[0])])
    assert torch.allclose(got0, torch.log_softmax(expected0, -1), atol=1e-6)
    got1 = torch.tensor([lp for _, lp in sorted(out.top_logprobs[1])])
    assert torch.allclose(got1, torch.log_softmax(logits[1], -1), atol=1e-6)


def test_penalties_over_many_rows_equal_a_per_token_reference() -> None:
    """Many penalized rows with long prompts and repeated output tokens (the keys found
    and counted on the host): every logit has the bits of the formulas applied token by
    token in plain PyTorch."""
    gen = torch.Generator().manual_seed(11)
    n, v = 73, 97
    logits = torch.randn(n, v, generator=gen) * 4
    rows, expected = [], logits.clone()
    rules = [(1.0, 0.0, 0.0), (1.3, 0.0, 0.0), (1.0, 0.6, -0.2), (0.7, -0.4, 1.1)]
    for i in range(n):
        prompt = torch.randint(0, v, (3 * i % 61,), generator=gen)
        output = torch.randint(0, v, (7 * i % 41,), generator=gen)
        rep, freq, pres = rules[i % 4]
        rows.append(
            row(prompt=prompt.tolist(), output=output.tolist(), repetition_penalty=rep,
                frequency_penalty=freq, presence_penalty=pres)
        )  # fmt: skip
        x = expected[i]
        if rep != 1.0:
            for t in set(prompt.tolist()) | set(output.tolist()):
                x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
        for t in set(output.tolist()):
            count = torch.tensor(float(output.tolist().count(t)))
            x[t] = x[t] - (torch.tensor(freq) * count + torch.tensor(pres))
    got = Sampler(v)._apply_rules(logits, rows, None)
    assert torch.equal(got, expected)


def test_logit_bias_matches_a_reference() -> None:
    """Biased rows sample and score as softmax(logits + bias); other rows are untouched."""
    logits = torch.randn(3, 40)
    bias = {3: 100.0, 7: -2.5, 11: 4.0}
    rows = [
        row(logit_bias=bias, temperature=0.0, return_logprob=True, top_logprobs_num=40),
        row(temperature=0.0, return_logprob=True, top_logprobs_num=40),
        row(logit_bias={int(logits[2].argmax()): -100.0}, temperature=0.0),
    ]
    reference = logits[0].clone()
    for token, b in bias.items():
        reference[token] += b
    out = Sampler(40).sample(logits, rows)
    assert out.top_logprobs is not None
    assert out.token_ids[0] == 3  # +100 forces it
    got0 = torch.tensor([lp for _, lp in sorted(out.top_logprobs[0])])
    assert torch.allclose(got0, torch.log_softmax(reference, -1), atol=1e-6)
    got1 = torch.tensor([lp for _, lp in sorted(out.top_logprobs[1])])
    assert torch.allclose(got1, torch.log_softmax(logits[1], -1), atol=1e-6)
    # -100 bans the greedy choice: the runner-up wins.
    assert out.token_ids[2] == int(logits[2].topk(2).indices[1])


def test_logit_bias_shifts_the_sampled_distribution() -> None:
    logits = torch.zeros(8)
    counts = torch.bincount(draws(logits, 4000, logit_bias={2: math.log(4.0)}), minlength=8)
    # Token 2 weighs 4, the seven others 1 each: 4/11 of the draws.
    assert abs(counts[2].item() / 4000 - 4 / 11) < 0.03


def test_min_new_tokens_bans_stop_ids() -> None:
    logits = torch.tensor([[0.0, 5.0, 9.0, 8.0]]).expand(3, -1).contiguous()
    rows = [
        row(output=[1], stop_ids=[2, 3], min_new_tokens=2, temperature=0.0),  # banned
        row(output=[1, 1], stop_ids=[2, 3], min_new_tokens=2, temperature=0.0),  # reached
        row(output=[1], stop_ids=[2], min_new_tokens=2),  # sampled: 2 never drawn
    ]
    sampler = Sampler(4)
    assert sampler.sample(logits, rows).token_ids[:2] == [1, 2]
    sampled = {sampler.sample(logits, rows).token_ids[2] for _ in range(300)}
    assert 2 not in sampled and 3 in sampled


def test_stop_token_set_respects_ignore_eos() -> None:
    assert stop_token_set(SamplingParams(stop_token_ids=(7,)), [2]) == {2, 7}
    assert stop_token_set(SamplingParams(stop_token_ids=(7,), ignore_eos=True), [2]) == {7}


def test_vocab_mask_respected() -> None:
    logits = torch.randn(2, 30)
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[0, [3, 17]] = True
    mask[1, 29] = True
    sampler = Sampler(30)
    rows = [row(), row(temperature=0.0)]
    for _ in range(200):
        a, b = sampler.sample(logits, rows, vocab_mask=mask).token_ids
        assert a in (3, 17) and b == 29
    greedy = sampler.sample(logits, many(2, temperature=0.0), vocab_mask=mask).token_ids
    assert greedy[0] == (3 if logits[0, 3] > logits[0, 17] else 17)


def test_logprobs_equal_log_softmax_at_chosen() -> None:
    logits = torch.randn(4, 40)
    rows = [
        row(return_logprob=True),
        row(),
        row(temperature=0.0, return_logprob=True),
        row(temperature=2.0, top_k=5, return_logprob=True),
    ]
    out = Sampler(40).sample(logits, rows)
    assert out.logprobs is not None and out.top_logprobs is not None
    ref = torch.log_softmax(logits, -1)  # before temperature / top-k, by design
    for i in (0, 2, 3):
        lp = out.logprobs[i]
        assert lp is not None
        assert lp == pytest.approx(ref[i, out.token_ids[i]].item(), abs=1e-6)
        assert out.top_logprobs[i] == []
    assert out.logprobs[1] is None and out.top_logprobs[1] == []


def test_top_logprobs_sorted_and_correct() -> None:
    logits = torch.randn(3, 40)
    rows = [
        row(return_logprob=True, top_logprobs_num=5),
        row(return_logprob=True),
        row(return_logprob=True, top_logprobs_num=2, temperature=0.0),
    ]
    out = Sampler(40).sample(logits, rows)
    assert out.top_logprobs is not None
    ref = torch.log_softmax(logits, -1)
    for i, k in ((0, 5), (1, 0), (2, 2)):
        top = out.top_logprobs[i]
        assert len(top) == k
        vals = [lp for _, lp in top]
        assert vals == sorted(vals, reverse=True)
        assert [t for t, _ in top] == ref[i].topk(k).indices.tolist()
        for t, lp in top:
            assert lp == pytest.approx(ref[i, t].item(), abs=1e-6)


def test_logprobs_reflect_masks() -> None:
    logits = torch.zeros(1, 4)
    mask = torch.tensor([[True, True, False, False]])
    out = Sampler(4).sample(logits, [row(return_logprob=True)], vocab_mask=mask)
    assert out.logprobs is not None
    assert out.logprobs[0] == pytest.approx(math.log(0.5))


def test_token_logprobs_manual() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, math.log(2.0)]])
    targets = torch.tensor([0, 2])
    lps, tops = token_logprobs(logits, targets, top_k=2)
    z0 = math.log(math.e + math.e**2 + math.e**3)
    assert lps[0] == pytest.approx(1.0 - z0, abs=1e-6)
    assert lps[1] == pytest.approx(math.log(0.5), abs=1e-6)
    assert [t for t, _ in tops[0]] == [2, 1]
    assert tops[0][0][1] == pytest.approx(3.0 - z0, abs=1e-6)
    assert tops[1][0] == (2, pytest.approx(math.log(0.5), abs=1e-6))
    lps0, tops0 = token_logprobs(logits, targets)
    assert lps0 == lps and tops0 == [[], []]


def test_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="logits"):
        Sampler(4).sample(torch.zeros(2, 4), many(3))


def test_tiny_temperature_samples_argmax() -> None:
    logits = torch.randn(16, 100) * 30
    out = Sampler(100).sample(logits, many(16, temperature=1e-30))
    assert out.token_ids == logits.argmax(-1).tolist()


def test_empty_batch() -> None:
    assert Sampler(10).sample(torch.empty(0, 10), []).token_ids == []


@pytest.mark.parametrize(
    ("params", "plain"),
    [
        ({"temperature": 0.0}, True),
        ({"temperature": 0.8, "top_k": 1}, True),
        ({"temperature": 0.0, "ignore_eos": True, "stop_token_ids": [3]}, True),
        ({"temperature": 0.8}, False),
        ({"temperature": 0.0, "return_logprob": True}, False),
        ({"temperature": 0.0, "repetition_penalty": 1.1}, False),
        ({"temperature": 0.0, "frequency_penalty": 0.5}, False),
        ({"temperature": 0.0, "logit_bias": {"3": 1.0}}, False),
        ({"temperature": 0.0, "min_new_tokens": 2}, False),
    ],
)
def test_plain_greedy_params_hold_for_every_row_with_them(
    params: dict[str, Any], plain: bool
) -> None:
    """What the model runner checks once per params object: True only where every row
    with these params is plain greedy, whatever its output and stop ids."""
    assert plain_greedy_params(SamplingParams(**params)) is plain
    if plain:
        for output in ((), (5,), (5, 6, 7)):
            for stops in ((), (3,), (5, 9)):
                assert all_plain_greedy([row((1, 2), output, stops, **params)])
