"""Tensor-parallel workers on CPU (gloo): the same logits and tokens as one rank.

The bundled model at tp 3 (9 heads and 3 KV heads split three ways; the tied embedding
and LM head split by vocabulary) and `dummy:tiny` at tp 2 against tp 1 with the same
options: every step's logits agree within 1e-4 (float32) and greedy tokens are equal,
through the radix cache and chunked prefill. A SIGKILLed rank ends the worker with a
clear error in bounded time, in process and as a `radixmesh worker --tp-size 2` process.

A process holds one TP group at a time, so each TP engine is class-scoped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from safetensors.torch import save_file

from radixmesh.client import Client
from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.worker.commands import Inspect
from radixmesh.worker.engine import Engine
from radixmesh.worker.layers.parallel import TPGroup
from radixmesh.worker.model.dummy import iter_dummy_weights, preset_arch
from radixmesh.worker.model.hf import iter_hf_weights
from radixmesh.worker.model.llama import LlamaForCausalLM
from radixmesh.worker.tp.step import StepHeader
from tests.worker.conftest import assert_engine_idle_and_clean

GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
# Prompts of 5..33 tokens: with max_num_batched_tokens 24 the long ones are chunked.
SMOL_OPTIONS: dict[str, Any] = dict(
    dtype="float32", kv_cache_tokens=4096, max_running_requests=8, max_num_batched_tokens=24
)
TINY_OPTIONS: dict[str, Any] = dict(
    dtype="float32", kv_cache_tokens=2048, max_running_requests=8, max_num_batched_tokens=64
)
PROMPTS = [
    "The capital of France is",
    "List three prime numbers:",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Translate 'good morning' into Spanish.",
    "Once upon a time, in a land far away, there lived a dragon who loved to read books "
    "about the stars, the planets and the long journeys of old explorers.",
    "What is 12 times 12?",
    "Name a color of the rainbow and explain in a sentence why the sky looks blue in the "
    "afternoon but red and orange at sunset, using the idea of light scattering.",
]
KILL_BOUND_S = 15.0  # a dead rank must end the engine / process within this


def _record_logits(engine: Engine) -> list[torch.Tensor]:
    """Every [N, V] logits tensor rank 0 computes from now on, in order."""
    model = engine.worker.runner.model
    seen: list[torch.Tensor] = []
    compute = model.compute_logits

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        out = compute(hidden)
        seen.append(out.clone())
        return out

    engine.call(lambda: setattr(model, "compute_logits", recording))
    return seen


def _run(engine: Engine, prompts: list[Any]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens of every prompt (one batch) and the logits of every step."""
    seen = _record_logits(engine)
    # Hold the scheduler thread until every request is queued, so that both engines
    # see the same batches (the same logits rows per step).
    gate = threading.Event()

    def hold() -> None:
        gate.wait(30)

    engine._post(Inspect(hold))  # not waited for: the thread runs it next
    threading.Timer(1.0, gate.set).start()
    if isinstance(prompts[0], str):
        outs = engine.generate(prompt=prompts, sampling_params=GREEDY)
    else:
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
    assert isinstance(outs, list)
    model = engine.worker.runner.model
    engine.call(lambda: model.__dict__.pop("compute_logits"))
    return [o["output_ids"] for o in outs], seen


def _assert_same_logits(ref: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    assert len(got) == len(ref)
    for step, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert a.shape == b.shape, step
        diff = (a - b).abs().max().item()
        assert diff < 1e-4, f"step {step}: max |logit difference| {diff}"


def _follower_pids(engine: Engine) -> list[int]:
    followers = engine.worker.followers
    assert followers is not None
    return followers.pids


def _wait_dead(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still alive after {timeout} s")


def test_step_header_round_trip() -> None:
    h = StepHeader([5, 6, 7, 9], [3, 0], [0, 10], [3, 1], logit_rows=[2, 3])
    assert StepHeader.decode(h.encode()) == h
    assert h.max_len == 11


@pytest.mark.parametrize(
    ("preset", "size", "message"),
    [
        ("smollm2-135m", 2, "the model's 9 attention heads do not split 2 ways"),
        ("qwen2-7b", 7, "the model's 4 KV heads neither split 7 ways nor replicate evenly"),
        ("smollm2-135m", 9, "the model's intermediate size 1536 does not split 9 ways"),
    ],
)
def test_tp_size_the_model_cannot_take(preset: str, size: int, message: str) -> None:
    with pytest.raises(InvalidArgument, match=f"tp_size: {message}"):
        Engine(f"dummy:{preset}", tp_size=size)


def test_dummy_preset_with_fewer_layers() -> None:
    arch = preset_arch("llama-3-70b@layers=4")
    assert (arch.num_hidden_layers, arch.hidden_size, arch.num_key_value_heads) == (4, 8192, 8)
    with pytest.raises(InvalidArgument, match="layer count"):
        preset_arch("tiny@layers=0")
    with pytest.raises(InvalidArgument, match="unknown dummy preset 'nope'"):
        preset_arch("nope@layers=2")


@pytest.mark.parametrize("rank", [0, 1])
def test_safetensors_slices_load_like_full_tensors(tmp_path: Path, rank: int) -> None:
    """Each rank reading only its slices (LazySlice) gets exactly the parameters that
    slicing full tensors gives; a layer-free check, no process group needed."""
    arch = preset_arch("tiny").replace(tie_word_embeddings=False, attention_bias=True)
    weights = dict(iter_dummy_weights(arch, dtype=torch.float32, device="cpu", seed=3))
    weights = {k: v + 0.5 if k.endswith(".bias") else v for k, v in weights.items()}
    save_file(weights, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(arch.to_hf_dict()))
    tp = TPGroup(rank=rank, size=2)
    models = []
    for sliced in (False, True):
        model = LlamaForCausalLM(arch, tp=tp)
        it = iter_hf_weights(tmp_path, arch, dtype=torch.float32, sliced=sliced)
        model.load_weights(it)
        models.append(dict(model.named_parameters()))
    full, lazy = models
    assert full.keys() == lazy.keys()
    for name in full:
        assert torch.equal(full[name], lazy[name]), name
    q = weights["model.layers.0.self_attn.q_proj.weight"]  # [4 heads * 16, 64]
    assert torch.equal(lazy["model.layers.0.self_attn.qkv_proj.weight"][:32], q[rank * 32 :][:32])
    down = weights["model.layers.1.mlp.down_proj.weight"]  # [64, 128]: columns split
    assert torch.equal(lazy["model.layers.1.mlp.down_proj.weight"], down[:, rank * 64 :][:, :64])
    head = weights["lm_head.weight"]  # [512, 64]: vocabulary rows split
    assert torch.equal(lazy["lm_head.weight"], head[rank * 256 :][:256])


@pytest.fixture(scope="class")
def reference(smollm2_gguf: object) -> Iterator[tuple[list[list[int]], list[Any]]]:
    """tp 1: greedy tokens and every step's logits for PROMPTS."""
    eng = Engine("smollm2", **SMOL_OPTIONS)
    try:
        yield _run(eng, PROMPTS)
    finally:
        eng.shutdown()


@pytest.fixture(scope="class")
def tp3(reference: object) -> Iterator[Engine]:
    eng = Engine("smollm2", tp_size=3, **SMOL_OPTIONS)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="class")
def tp2() -> Iterator[Engine]:
    eng = Engine("dummy:tiny", tp_size=2, **TINY_OPTIONS)
    yield eng
    eng.shutdown()


@pytest.mark.slow
class TestSmolLM2TP3:
    def test_shards(self, tp3: Engine) -> None:
        w = tp3.worker
        assert w.tp.size == 3 and w.tp.rank == 0
        assert w.kv_pool.num_kv_heads == 1  # 3 KV heads over 3 ranks
        assert w.model.lm_head.weight is w.model.model.embed_tokens.weight  # still tied
        assert tuple(w.model.lm_head.weight.shape) == (49152 // 3, 576)
        assert len(_follower_pids(tp3)) == 2

    def test_logits_and_greedy_tokens_match_tp1(
        self, reference: tuple[list[list[int]], list[torch.Tensor]], tp3: Engine
    ) -> None:
        ref_tokens, ref_logits = reference
        tokens, logits = _run(tp3, PROMPTS)
        assert tokens == ref_tokens
        _assert_same_logits(ref_logits, logits)
        assert_engine_idle_and_clean(tp3)

    def test_radix_cache_hit_and_chunked_prefill(
        self, reference: tuple[list[list[int]], list[torch.Tensor]], tp3: Engine
    ) -> None:
        long_prompt = PROMPTS[7]
        assert len(tp3.tokenizer.encode(long_prompt)) > SMOL_OPTIONS["max_num_batched_tokens"]
        first = tp3.generate(long_prompt, GREEDY)
        again = tp3.generate(long_prompt, GREEDY)
        assert isinstance(first, dict) and isinstance(again, dict)
        assert first["output_ids"] == again["output_ids"] == reference[0][7]
        assert again["meta_info"]["cached_tokens"] > 0
        assert_engine_idle_and_clean(tp3)


@pytest.mark.slow
class TestTinyTP2:
    def test_logits_and_greedy_tokens_match_tp1(self, tp2: Engine) -> None:
        prompts = [[1 + (7 * i + 3 * j) % 500 for j in range(5 + 11 * i)] for i in range(8)]
        ref_engine = Engine("dummy:tiny", **TINY_OPTIONS)
        try:
            ref_tokens, ref_logits = _run(ref_engine, prompts)
        finally:
            ref_engine.shutdown()
        tokens, logits = _run(tp2, prompts)
        assert tokens == ref_tokens
        _assert_same_logits(ref_logits, logits)
        assert tp2.worker.kv_pool.num_kv_heads == 1  # 2 KV heads over 2 ranks

    def test_one_tp_engine_per_process(self, tp2: Engine) -> None:
        with pytest.raises(InvalidArgument, match="tp_size: this process already holds"):
            Engine("dummy:tiny", tp_size=2, **TINY_OPTIONS)
        assert torch.distributed.is_initialized()  # the first engine's group is intact
        out = tp2.generate(input_ids=[1, 2, 3], sampling_params=GREEDY)
        assert isinstance(out, dict) and len(out["output_ids"]) == 6

    def test_shutdown_stops_every_rank(self, tp2: Engine) -> None:
        pids = _follower_pids(tp2)
        tp2.shutdown()
        for pid in pids:
            _wait_dead(pid, 15.0)
        assert not torch.distributed.is_initialized()


@pytest.mark.slow
def test_tiny_tp2_with_fp8_weights_and_kv_matches_tp1() -> None:
    """Each rank holds exactly tp 1's FP8 rows (row-parallel: the full row's scale) and its
    own KV heads' FP8 values and scales: the same logits as tp 1."""
    prompts = [[1 + (7 * i + 3 * j) % 500 for j in range(5 + 11 * i)] for i in range(4)]
    options = {**TINY_OPTIONS, "quantization": "fp8", "kv_cache_dtype": "fp8"}
    ref_engine = Engine("dummy:tiny", **options)
    try:
        ref_tokens, ref_logits = _run(ref_engine, prompts)
    finally:
        ref_engine.shutdown()
    eng = Engine("dummy:tiny", tp_size=2, **options)
    try:
        assert eng.worker.kv_pool.quantized and eng.worker.quantization == "fp8"
        tokens, logits = _run(eng, prompts)
        assert tokens == ref_tokens
        _assert_same_logits(ref_logits, logits)
        assert_engine_idle_and_clean(eng)
    finally:
        eng.shutdown()


def _generate_in_thread(engine: Engine) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []
    params = {"temperature": 0.0, "max_new_tokens": 1500, "ignore_eos": True}

    def run() -> None:
        try:
            engine.generate(input_ids=[1, 2, 3], sampling_params=params)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


@pytest.mark.slow
@pytest.mark.parametrize("busy", [False, True], ids=["idle", "in-flight"])
def test_killed_rank_ends_the_engine(busy: bool) -> None:
    eng = Engine("dummy:tiny", tp_size=2, **TINY_OPTIONS)
    try:
        (pid,) = _follower_pids(eng)
        if busy:
            thread, errors = _generate_in_thread(eng)
            deadline = time.monotonic() + 30
            while eng.get_stats().num_running == 0:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        if busy:
            thread.join(KILL_BOUND_S)
            assert not thread.is_alive()
            assert len(errors) == 1 and isinstance(errors[0], Unavailable), errors
            assert "tensor-parallel" in str(errors[0])
        while eng.fatal is None:
            assert time.monotonic() - t0 < KILL_BOUND_S
            time.sleep(0.05)
        assert f"rank 1 (pid {pid}) exited unexpectedly with code -9" in eng.fatal
        with pytest.raises(Unavailable, match="tensor-parallel rank 1"):
            eng.generate(input_ids=[1, 2, 3], sampling_params=GREEDY)
    finally:
        eng.shutdown()
    assert not torch.distributed.is_initialized()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawned_ranks(pid: int) -> list[int]:
    """The worker's follower ranks (not multiprocessing's resource tracker)."""
    ranks = []
    # psutil finds children by their parent pid, so also those a helper thread spawned
    for child in psutil.Process(pid).children():
        cmdline = Path(f"/proc/{child.pid}/cmdline").read_bytes()
        if b"spawn_main" in cmdline:
            ranks.append(child.pid)
    return ranks


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.slow
def test_worker_process_tp2_serves_then_exits_when_a_rank_dies(tmp_path: Path) -> None:
    port = _free_port()
    cmd = [sys.executable, "-m", "radixmesh.cluster.cli", "worker", "--model", "dummy:tiny"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--tp-size", "2"]
    cmd += ["--dtype", "float32", "--kv-cache-tokens", "2048"]
    log = tmp_path / "worker.log"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        client = Client(f"127.0.0.1:{port}", timeout=60)
        _wait(lambda: client.health(timeout=2), 180, "the worker never became healthy")
        out = client.generate(input_ids=[1, 5, 9, 17, 33], sampling_params=GREEDY)
        ref = Engine("dummy:tiny", **TINY_OPTIONS)
        try:
            expected = ref.generate(input_ids=[1, 5, 9, 17, 33], sampling_params=GREEDY)
        finally:
            ref.shutdown()
        assert isinstance(expected, dict)
        assert out.token_ids == expected["output_ids"]
        (rank1,) = _spawned_ranks(proc.pid)
        t0 = time.monotonic()
        os.kill(rank1, signal.SIGKILL)
        assert proc.wait(timeout=KILL_BOUND_S) == 1, log.read_text()
        assert time.monotonic() - t0 < KILL_BOUND_S
        text = log.read_text()
        assert "worker failed, exiting: " in text
        assert "tensor-parallel rank 1" in text
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_cuda_tp2_with_graphs_matches_tp1() -> None:
    """NCCL on cuda:0 and cuda:1, triton attention, decode CUDA graphs capturing the
    all-reduces (one-shot over symmetric memory for the small ones): float32 logits within
    1e-4 of one GPU's, the same greedy tokens."""
    model = "dummy:llama-3-8b@layers=2"
    opts: dict[str, Any] = dict(
        dtype="float32", kv_cache_tokens=8192, max_running_requests=8, device="cuda"
    )
    prompts = [[1000 + (37 * i + 11 * j) % 120000 for j in range(8 + 9 * i)] for i in range(8)]
    ref = Engine(model, **opts)
    try:
        ref_tokens, ref_logits = _run(ref, prompts)
    finally:
        ref.shutdown()
    torch.cuda.empty_cache()
    eng = Engine(model, tp_size=2, **opts)
    try:
        graphs = eng.worker.runner.decode_graphs
        assert graphs is not None
        # Decode steps' all-reduces go through symmetric memory (tp/one_shot.py).
        assert eng.worker.tp.fast_all_reduce is not None
        tokens, logits = _run(eng, prompts)
        assert graphs.num_replays > 0
        assert str(eng.worker.device) == "cuda:0"
    finally:
        eng.shutdown()
    assert tokens == ref_tokens
    _assert_same_logits(ref_logits, logits)
