"""`step_anatomy --workload prefill` on CPU with dummy:tiny, two requests per workload:
the step kinds, token counts, GEMM shapes and attention FLOPs of the workloads given, and
the throughput run's window of decode steps with their distribution and host shares."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench import step_anatomy
from radixmesh.worker.model.dummy import preset_arch

TINY = preset_arch("tiny")  # hidden 64, 2 layers, 4 query heads of 16, vocab 512


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("anatomy") / "prefill.json"
    argv = ["--workload", "prefill", "--model", "dummy:tiny", "--device", "cpu"]
    argv += ["--requests", "2", "--kv-cache-bytes", str(1 << 26), "--out", str(out)]
    argv += ["--decode-steps", "4"]
    step_anatomy.main(argv)
    record = json.loads(out.read_text())
    assert record["benchmark"] == "step_anatomy"
    assert record["command"]["workload"] == "prefill"
    return record["result"]


def attention_tflop(keys: int) -> float:
    return 4 * TINY.head_size * TINY.num_attention_heads * TINY.num_hidden_layers * keys / 1e12


def test_throughput_prefills_both_prompts_in_one_step(result: dict[str, Any]) -> None:
    run = result["throughput"]
    assert run["workload"] == {"requests": 2, "input": 512, "new_tokens": 256}
    warm = run["warmup"]
    assert warm["steps"] == 256  # one prefill, then 255 decode steps
    assert warm["by_kind"]["prefill"]["steps"] == 1
    assert warm["by_kind"]["prefill"]["prompt_tokens"] == 1024
    assert warm["by_kind"]["decode"]["steps"] == 255
    assert warm["by_kind"]["decode"]["tokens"] == 2 * 255
    prof = run["profiled"]
    # the prefill, then --decode-steps decode steps
    assert prof["steps"] == 5 and prof["step_ranges"] == 5
    assert prof["kernels_unattributed"] == 0
    pre = prof["by_kind"]["prefill"]
    assert (pre["steps"], pre["tokens"], pre["prompt_tokens"]) == (1, 1024, 1024)
    assert pre["decode_rows"] == 0 and pre["cached_prefix_tokens"] == 0
    dec = prof["by_kind"]["decode"]
    assert (dec["steps"], dec["tokens"], dec["decode_rows"]) == (4, 8, 8)
    calls = {r["mnk"]: r["calls"] for r in pre["gemm_shapes"]}
    # per layer: qkv (64 -> 128), o_proj, gate_up (64 -> 256), down; then the LM head
    assert calls == {
        "1024x128x64": 2,
        "1024x64x64": 2,
        "1024x256x64": 2,
        "1024x64x128": 2,
        "2x512x64": 1,
    }
    keys = 2 * 512 * 513 // 2
    assert pre["attention"]["tflop_prompt_rows"] == pytest.approx(attention_tflop(keys))
    assert pre["attention"]["tflop_decode_rows"] == 0


def test_shared_prefix_computes_the_prefix_once(result: dict[str, Any]) -> None:
    run = result["shared_prefix"]
    assert run["workload"]["groups"] == 1 and run["workload"]["per_group"] == 2
    kinds = run["profiled"]["by_kind"]
    assert {k: v["steps"] for k, v in kinds.items()} == {"prefill": 1, "mixed": 1, "decode": 7}
    assert kinds["prefill"]["prompt_tokens"] == 1600
    mixed = kinds["mixed"]
    # the second request's own 64 tokens over the cached 1,536, beside the first's decode
    assert (mixed["prompt_tokens"], mixed["cached_prefix_tokens"], mixed["decode_rows"]) == (
        64,
        1536,
        1,
    )
    assert mixed["attention"]["tflop_prompt_rows"] == pytest.approx(
        attention_tflop(64 * 1536 + 64 * 65 // 2)
    )
    assert mixed["attention"]["tflop_decode_rows"] == pytest.approx(attention_tflop(1601))
    assert sum(v["decode_rows"] for v in kinds.values()) == 2 * 7
    assert run["warmup"]["steps"] == 9


def test_every_kind_accounts_for_its_span(result: dict[str, Any]) -> None:
    for name in ("throughput", "shared_prefix"):
        for kind in result[name]["profiled"]["by_kind"].values():
            assert kind["busy_ms"] <= kind["span_ms"] + 1e-6
            assert kind["by_category_ms"]["gemm"] > 0
            assert kind["attention"]["ms"] > 0
            assert sum(kind["gap_ms"].values()) == pytest.approx(kind["span_ms"] - kind["floor_ms"])
            assert {"schedule", "forward", "process_output"} <= kind["host_phase_ms"].keys()


def test_decode_window_reports_its_distribution_and_host_shares(result: dict[str, Any]) -> None:
    dec = result["throughput"]["profiled"]["by_kind"]["decode"]
    wall, idle = dec["wall_ms_dist"], dec["idle_ms_dist"]
    assert wall["median"] <= wall["p90"] <= wall["max"]
    assert wall["mean"] == pytest.approx(dec["wall_ms"])
    assert 0 <= idle["median"] <= idle["max"]
    shares = dec["host_phase_share"]
    assert shares.keys() == {"schedule", "launch", "process_output", "wait", "other"}
    assert sum(shares.values()) == pytest.approx(1.0)
    # synchronous on the CPU: every step reads its own sampled ids, and launches its forward
    assert dec["host_phase_ms"]["wait"] > 0
    assert shares["launch"] > shares["schedule"] > 0


def test_kernel_kinds_put_the_fp8_decode_kernels_in_attention() -> None:
    kind = step_anatomy._kernel_kind
    assert kind("void (anonymous namespace)::decode_fp8_split<2, 8>(Params)") == "attention"
    assert kind("_decode_merge_kernel") == "attention"
    assert kind("_extend_kernel") == "attention"
    assert kind("void (anonymous namespace)::gemv<8, true, false>(GemvParams)") == "gemm"
    assert kind("nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT") == "gemm"
    assert kind("_fp8_small_m_kernel") == "gemm"
    assert kind("_rms_norm_kernel") == "triton"
    assert kind("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "nccl"


def test_batch1_with_drafts_that_are_never_kept_verifies_every_step_it_can(
    tmp_path: Any,
) -> None:
    """8 tokens: the prefill samples the first, then each step verifies 2 drafts and adds
    one token while at least 2 more remain after it (6 steps), and the last is plain."""
    out = tmp_path / "verify.json"
    argv = ["--workload", "batch1", "--model", "dummy:tiny", "--steps", "8"]
    argv += ["--prompt-len", "16", "--draft-tokens", "2", "--max-running-requests", "8"]
    argv += ["--cuda-graph-max-batch-size", "8", "--out", str(out)]
    step_anatomy.main(argv)
    record = json.loads(out.read_text())
    res = record["result"]
    assert (res["draft_tokens"], res["verify_steps"], res["steps"]) == (2, 6, 8)
    assert "verify" in res["host_phase_ms_mean"] and "schedule" in res["host_phase_ms_mean"]
    medians = res["host_phase_us_median"]
    parts = {"inputs", "attn_prepare", "model", "logits", "drafts", "alloc_decode", "trim"}
    assert parts | {"free_trimmed", "read_verified", "host"} <= medians.keys()
    assert 0 < medians["inputs"] < medians["runner_forward"] < medians["launch"]
    assert medians["host"] > 0


def test_json_workload_reports_each_step_kind(tmp_path: Any) -> None:
    """The constrained workload on the CPU: every step is recorded with its forward time,
    the deferred draw's included, with jump-forward on and off."""
    out = tmp_path / "json.json"
    argv = ["--workload", "json", "--model", "dummy:tiny", "--documents", "3"]
    step_anatomy.main([*argv, "--cuda-graph-max-batch-size", "0", "--out", str(out)])
    res = json.loads(out.read_text())["result"]
    for run in ("on", "off"):
        kinds = res[run]["by_kind"]
        assert sum(k["steps"] for k in kinds.values()) == res[run]["steps"] > 0
        assert all(k["forward_ms_mean"] > 0 for k in kinds.values())


def test_prefill_with_sampling_records_it_and_profiles_every_step(tmp_path: Any) -> None:
    """`--temperature/--top-p`: every request samples (its draws deferred behind the next
    step's build under the overlap scheduler); the run says so and its steps are the
    greedy run's kinds."""
    out = tmp_path / "sampled.json"
    argv = ["--workload", "prefill", "--model", "dummy:tiny", "--device", "cpu"]
    argv += ["--requests", "2", "--kv-cache-bytes", str(1 << 26), "--decode-steps", "4"]
    argv += ["--prefill-workloads", "throughput", "--temperature", "0.7", "--top-p", "0.9"]
    step_anatomy.main([*argv, "--out", str(out)])
    run = json.loads(out.read_text())["result"]["throughput"]
    assert run["workload"]["sampling"] == {"temperature": 0.7, "top_p": 0.9}
    kinds = run["profiled"]["by_kind"]
    assert run["profiled"]["steps"] == sum(k["steps"] for k in kinds.values()) > 0
