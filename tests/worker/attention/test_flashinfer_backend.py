"""The flashinfer backend on the GPU: against the float64 reference over the slot table,
inside a model against transformers, and inside the engine with decode CUDA graphs.
Needs CUDA and the `flashinfer` extra; its absence is tested on CPU (test_selection.py)."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.attention.registry import create_attention_backend
from tests.worker.attention.test_torch_backend import LAYER, MIXED, make_case, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(autouse=True)
def flashinfer_installed() -> None:
    pytest.importorskip("flashinfer", reason="the flashinfer extra is not installed")


@pytest.mark.parametrize(
    "seqs",
    [
        MIXED,
        [(10, 1), (0, 1), (33, 1), (7, 1)],
        [(0, 12)],
        [(9, 5), (0, 3)],
        [(9, 5), (20, 8), (10, 1), (33, 1)],
        [(50, 1), (31, 1), (40, 9), (4, 1), (62, 1)],
    ],
    ids=["mixed", "decode-only", "one-prompt", "extends-only", "extends-then-decodes",
         "forced-tokens-beside-decodes"],
)  # fmt: skip
def test_matches_reference(seqs: list[tuple[int, int]]) -> None:
    from radixmesh.worker.attention.flashinfer_backend import (
        FlashInferMeta,
        MixedFlashInferMeta,
    )

    # head_dim 128 throughout this file: one set of FlashInfer modules to compile.
    head_dim = 128
    pool, batch, q, k, v = make_case(
        seqs, 32, 8, dtype=torch.bfloat16, device="cuda", head_dim=head_dim
    )
    scale = head_dim**-0.5
    backend = create_attention_backend("flashinfer", pool, scale)
    backend.prepare(batch)
    meta = batch.attn_metadata
    decode_rows = sum(e == 1 for _, e in seqs)
    if 0 < decode_rows < len(seqs):
        assert isinstance(meta, MixedFlashInferMeta)
        kinds = "".join("e" if n > 1 else "d" for _, n in seqs)  # "eded...": extend/decode
        contiguous = "d" not in kinds.strip("d")  # one run of extend rows: a slice of q
        assert isinstance(meta.extend_tokens, slice) == contiguous, kinds
    else:
        assert isinstance(meta, FlashInferMeta)
        assert (meta.qo_indptr is None) == batch.is_decode_only
    out = backend.forward(q, k, v, LAYER, batch)
    out_again = backend.forward(q, k, v, LAYER, batch)  # a second layer reuses the plan
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    ref = reference(pool, batch, q, scale)
    err = (out.double().cpu() - ref).abs().max().item()
    assert err < 2e-2, err  # bf16 outputs of values ~N(0, 1)
    assert torch.equal(out, out_again)
    loc = batch.out_cache_loc
    assert torch.equal(pool.k_buffers[LAYER][loc], k) and torch.equal(pool.v_buffers[LAYER][loc], v)


def test_shared_prefix_decode_runs_the_cascade() -> None:
    """12 decode rows in 3 groups sharing 40, 25 and 33 cached tokens: the cascade runs
    (each group's prefix read once) and matches the reference."""
    from radixmesh.worker.attention.flashinfer_backend import (
        CascadeMeta,
        FlashInferAttentionBackend,
    )
    from radixmesh.worker.forward_batch import ForwardBatch
    from radixmesh.worker.kvcache.pool import KVPool

    head_dim, hq, hkv = 128, 32, 8
    gen = torch.Generator().manual_seed(5)
    pool = KVPool(num_slots=512, num_layers=2, num_kv_heads=hkv, head_dim=head_dim,
                  dtype=torch.bfloat16, device="cuda")  # fmt: skip
    table = torch.zeros(16, 64, dtype=torch.int64)
    free = (torch.randperm(511, generator=gen) + 1).tolist()
    rows = torch.randperm(16, generator=gen)[:12].tolist()
    seq_lens, new_slots = [], []
    for g, shared in enumerate((40, 25, 33)):
        prefix = [free.pop() for _ in range(shared)]
        for j in range(4):
            own = [free.pop() for _ in range(2 + 3 * j)]
            row = rows[4 * g + j]
            table[row, : shared + len(own)] = torch.tensor(prefix + own)
            seq_lens.append(shared + len(own))
            new_slots.append(own[-1])
    for buf in (pool.k_buffers[LAYER], pool.v_buffers[LAYER]):
        buf.copy_(torch.randn(buf.shape, generator=gen).to(torch.bfloat16))
    order = torch.randperm(12, generator=gen).tolist()  # the groups interleaved in the batch
    batch = ForwardBatch.build(
        input_ids=[0] * 12,
        out_cache_loc=torch.tensor([new_slots[i] for i in order]),
        req_rows=[rows[i] for i in order],
        prefix_lens=[seq_lens[i] - 1 for i in order],
        extend_lens=[1] * 12,
        req_to_token=table.cuda(),
    )
    batch.req_to_token_host = table.numpy()
    q = torch.randn(12, hq, head_dim, generator=gen).to(torch.bfloat16).cuda()
    k = torch.randn(12, hkv, head_dim, generator=gen).to(torch.bfloat16).cuda()
    v = torch.randn(12, hkv, head_dim, generator=gen).to(torch.bfloat16).cuda()
    backend = create_attention_backend("flashinfer", pool, head_dim**-0.5)
    assert isinstance(backend, FlashInferAttentionBackend)
    backend.cascade = True  # off by default (its docstring says why)
    backend.prepare(batch)
    assert isinstance(batch.attn_metadata, CascadeMeta)
    out = backend.forward(q, k, v, LAYER, batch)
    err = (out.double().cpu() - reference(pool, batch, q, head_dim**-0.5)).abs().max().item()
    assert err < 2e-2, err


def test_model_matches_transformers_as_closely_as_triton() -> None:
    """bfloat16 logits against transformers' float32 through prefill, extend over a cached
    prefix beside a new prompt, and decode steps: no further off than the triton
    backend's on the same model (a wrong mask or slot would be many times further)."""
    from radixmesh.worker.model.llama import LlamaForCausalLM
    from tests.worker.model.helpers import RaggedRunner, hf_logits, make_pair, random_ids

    # head_dim 128 (512 / 4 heads), one KV head (GQA 4).
    hf, cpu_model = make_pair("llama", hidden_size=512, num_key_value_heads=1)
    ours = LlamaForCausalLM(cpu_model.arch, dtype=torch.bfloat16, device="cuda")
    ours.load_weights(hf.state_dict().items())
    a, b = random_ids(70, seed=6), random_ids(9, seed=7)
    want_a, want_b = hf_logits(hf, a[:64]), hf_logits(hf, b + a[:4])
    errors = {}
    for backend in ("triton", "flashinfer"):
        runner = RaggedRunner(ours, backend=backend)
        (a1,) = runner.step([(0, a[:40])])
        a2, b1 = runner.step([(0, a[40:60]), (1, b)])
        steps = [runner.step([(1, [a[i]]), (0, [a[60 + i]])]) for i in range(4)]
        got_a = torch.cat([a1, a2, *(s[1] for s in steps)]).cpu()
        got_b = torch.cat([b1, *(s[0] for s in steps)]).cpu()
        errors[backend] = [
            (got - want).abs().mean().item() for got, want in ((got_a, want_a), (got_b, want_b))
        ]
    scale = want_a.abs().mean().item()
    for fi, tr in zip(errors["flashinfer"], errors["triton"], strict=True):
        assert fi < 1.5 * tr + 1e-3 * scale, errors
        assert fi < 0.1 * scale, (errors, scale)  # bf16 noise, not garbage


def test_engine_replays_graphs_and_accounts_for_every_slot() -> None:
    """The engine with the flashinfer backend: decode steps replay the graphs (re-planned
    per batch), prompts share a cached prefix, every slot is free or cached after."""
    from radixmesh.worker.engine import Engine
    from tests.worker.conftest import assert_engine_idle_and_clean

    shared = [(5 * j) % 400 + 3 for j in range(40)]
    prompts = [shared + [(7 * i + j) % 500 + 3 for j in range(5 + 9 * i)] for i in range(11)]
    params = [
        {"temperature": 0.0, "max_new_tokens": 4 + 3 * i, "ignore_eos": True} for i in range(11)
    ]
    with Engine(
        "dummy:llama-3-8b@layers=2",
        device="cuda",
        dtype="bfloat16",
        attention_backend="flashinfer",
        cuda_graph_max_batch_size=32,
        kv_cache_tokens=8192,
        max_running_requests=32,
    ) as eng:
        from radixmesh.worker.attention.flashinfer_backend import FlashInferAttentionBackend

        runner = eng.worker.runner
        attn = runner.attn
        assert isinstance(attn, FlashInferAttentionBackend)
        assert runner.decode_graphs is not None
        attn.cascade = True  # off by default; here its engine path is what is tested
        # The prefix in the radix cache first, so that the 11 prompts share its slots.
        eng.generate(input_ids=[*shared, 7], sampling_params={"max_new_tokens": 1})
        res = eng.generate(input_ids=prompts, sampling_params=params)
        assert isinstance(res, list)
        assert [len(r["output_ids"]) for r in res] == [4 + 3 * i for i in range(11)]
        # Steps of 8 or more rows sharing the 40-token prompt run the cascade, eagerly;
        # fewer rows replay the graphs.
        assert runner.decode_graphs.num_replays >= 15
        assert attn.num_cascade_steps >= 5
        again = eng.generate(input_ids=prompts[3], sampling_params=params[3])
        assert isinstance(again, dict)
        assert again["meta_info"]["cached_tokens"] >= 40
        assert_engine_idle_and_clean(eng)


def test_engine_refuses_what_it_cannot_serve() -> None:
    from radixmesh.worker.engine import Engine

    with pytest.raises(ValueError, match=r"attention_backend: 'flashinfer'.*kv_cache_dtype"):
        Engine("dummy:tiny", device="cuda", attention_backend="flashinfer", kv_cache_dtype="fp8")
