"""One model step on this machine: radixmesh's LlamaForCausalLM + torch attention backend
vs transformers' LlamaForCausalLM, same shape, random weights.

Steps (the runner's view: prepare + forward + logits of the rows it samples):
  decode   batch 32, contexts 180..220 tokens (ragged; transformers: all 200), 1 new token
  prefill  one 512-token prompt, logits of its last token
Default shape: smollm2-135m (30 layers, hidden 576, 9 heads, 3 KV heads, vocab 49152).

Run: `.venv/bin/python -m bench.model_step [--preset smollm2-135m] [--dtypes float32 bfloat16]
[--repeats 20] [--no-hf] [--threads N]`. Prints a table in milliseconds (median).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bench import record
from radixmesh.worker.attention.registry import create_attention_backend
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.kvcache.pool import KVPool
from radixmesh.worker.model.arch import PRESETS, LlamaArchConfig
from radixmesh.worker.model.llama import LlamaForCausalLM

DECODE_BATCH, DECODE_CONTEXT, PREFILL_LEN = 32, 200, 512


def random_weights(arch: LlamaArchConfig, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Full tensors under Hugging Face names (what a checkpoint loader yields)."""
    gen = torch.Generator().manual_seed(seed)
    h, d, inter = arch.hidden_size, arch.head_size, arch.intermediate_size
    q, kv = arch.num_attention_heads * d, arch.num_key_value_heads * d

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * 0.02

    yield "model.embed_tokens.weight", rand(arch.vocab_size, h)
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}."
        yield from [
            (p + "self_attn.q_proj.weight", rand(q, h)),
            (p + "self_attn.k_proj.weight", rand(kv, h)),
            (p + "self_attn.v_proj.weight", rand(kv, h)),
            (p + "self_attn.o_proj.weight", rand(h, q)),
            (p + "mlp.gate_proj.weight", rand(inter, h)),
            (p + "mlp.up_proj.weight", rand(inter, h)),
            (p + "mlp.down_proj.weight", rand(h, inter)),
            (p + "input_layernorm.weight", torch.ones(h)),
            (p + "post_attention_layernorm.weight", torch.ones(h)),
        ]
    if arch.attention_bias:
        raise SystemExit("bench: presets with qkv bias are not wired up here")
    yield "model.norm.weight", torch.ones(h)
    if not arch.tie_word_embeddings:
        yield "lm_head.weight", rand(arch.vocab_size, h)


def timed(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median ms of each fn; the fns take turns so that load from other processes on a
    shared machine falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(warmup + repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


class Ours:
    def __init__(self, arch: LlamaArchConfig, dtype: torch.dtype) -> None:
        self.model = LlamaForCausalLM(arch, dtype=dtype)
        self.model.load_weights(random_weights(arch))
        width = max(PREFILL_LEN, DECODE_CONTEXT + 32)  # req->token table columns
        slots = DECODE_BATCH * (DECODE_CONTEXT + 32) + PREFILL_LEN + 1
        pool = KVPool(
            num_slots=slots,
            num_layers=arch.num_hidden_layers,
            num_kv_heads=self.model.num_kv_heads,
            head_dim=arch.head_size,
            dtype=dtype,
            device="cpu",
        )
        self.attn = create_attention_backend("torch", pool, arch.attention_scale)
        # Every sequence's KV scattered over the pool, as after a while of serving.
        perm = (torch.randperm(slots - 1, generator=torch.Generator().manual_seed(1)) + 1).tolist()
        self.req_to_token = torch.zeros(DECODE_BATCH + 1, width, dtype=torch.int64)
        self.req_to_token[0, :PREFILL_LEN] = torch.tensor(perm[:PREFILL_LEN])  # row 0: prefill
        rest = torch.tensor(perm[PREFILL_LEN:])[: DECODE_BATCH * (DECODE_CONTEXT + 32)]
        self.req_to_token[1:, : DECODE_CONTEXT + 32] = rest.view(DECODE_BATCH, -1)
        self.vocab = arch.vocab_size

    def step(self, batch: ForwardBatch, sample_rows: torch.Tensor) -> torch.Tensor:
        self.attn.prepare(batch)
        hidden = self.model(batch, self.attn)
        return self.model.compute_logits(hidden.index_select(0, sample_rows))

    def decode_batch(self) -> ForwardBatch:
        prefix = [DECODE_CONTEXT - 20 + (7 * b) % 41 for b in range(DECODE_BATCH)]  # 180..220
        rows = list(range(1, DECODE_BATCH + 1))
        return ForwardBatch.build(
            input_ids=[(13 * b) % self.vocab for b in rows],
            out_cache_loc=self.req_to_token[rows, prefix],
            req_rows=rows,
            prefix_lens=prefix,
            extend_lens=[1] * DECODE_BATCH,
            req_to_token=self.req_to_token,
        )

    def prefill_batch(self) -> ForwardBatch:
        return ForwardBatch.build(
            input_ids=[(31 * i) % self.vocab for i in range(PREFILL_LEN)],
            out_cache_loc=self.req_to_token[0, :PREFILL_LEN],
            req_rows=[0],
            prefix_lens=[0],
            extend_lens=[PREFILL_LEN],
            req_to_token=self.req_to_token,
        )

    def steps(self) -> dict[str, Callable[[], object]]:
        dec, pre = self.decode_batch(), self.prefill_batch()
        all_rows, last = torch.arange(DECODE_BATCH), torch.tensor([PREFILL_LEN - 1])
        return {
            "decode": lambda: self.step(dec, all_rows),
            "prefill": lambda: self.step(pre, last),
        }


class Transformers:
    def __init__(self, arch: LlamaArchConfig, dtype: torch.dtype) -> None:
        import transformers

        options: dict[str, Any] = {**arch.to_hf_dict(), "attn_implementation": "sdpa"}
        model: torch.nn.Module = transformers.LlamaForCausalLM(transformers.LlamaConfig(**options))
        self.model = model.to(dtype).eval()
        self.vocab = arch.vocab_size

    def steps(self) -> dict[str, Callable[[], object]]:
        from transformers import DynamicCache

        prompt = torch.arange(DECODE_CONTEXT).repeat(DECODE_BATCH, 1) % self.vocab
        cache = DynamicCache()
        with torch.inference_mode():
            self.model(prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        next_ids = torch.arange(DECODE_BATCH)[:, None]

        def decode() -> None:
            self.model(next_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.crop(-1)  # drop the new token: the context length stays fixed

        prefill_ids = (torch.arange(PREFILL_LEN) * 31 % self.vocab)[None]
        return {
            "decode": decode,
            "prefill": lambda: self.model(prefill_ids, use_cache=False, logits_to_keep=1),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m", choices=sorted(PRESETS))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    record.add_output_arguments(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    arch = PRESETS[args.preset]
    print(
        f"{args.preset}: {arch.num_hidden_layers} layers, hidden {arch.hidden_size}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        f"decode: batch {DECODE_BATCH}, ~{DECODE_CONTEXT}-token contexts; "
        f"prefill: {PREFILL_LEN} tokens"
    )
    print(f"load average {_load()} (other processes on this machine skew timings)")
    print(f"{'impl':<14}{'dtype':<10}{'decode ms':>11}{'tok/s':>9}{'prefill ms':>12}{'tok/s':>9}")
    rows = []
    for name in args.dtypes:
        dtype = getattr(torch, name)
        impls: dict[str, Ours | Transformers] = {"radixmesh": Ours(arch, dtype)}
        if not args.no_hf:
            impls["transformers"] = Transformers(arch, dtype)
        with torch.inference_mode():
            steps = {label: impl.steps() for label, impl in impls.items()}
            decode = timed({k: v["decode"] for k, v in steps.items()}, args.repeats)
            prefill = timed({k: v["prefill"] for k, v in steps.items()}, max(3, args.repeats // 4))
        for label in impls:
            print(
                f"{label:<14}{name:<10}{decode[label]:>11.1f}"
                f"{DECODE_BATCH / decode[label] * 1e3:>9.0f}{prefill[label]:>12.1f}"
                f"{PREFILL_LEN / prefill[label] * 1e3:>9.0f}"
            )
            rows.append(
                {
                    "impl": label,
                    "dtype": name,
                    "decode_ms": decode[label],
                    "prefill_ms": prefill[label],
                }
            )
    print(f"load average {_load()}")
    shape = {"decode_batch": DECODE_BATCH, "decode_context": DECODE_CONTEXT, "prefill": PREFILL_LEN}
    record.write("model_step", args, {"shape": shape, "medians": rows}, name=args.preset)


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
