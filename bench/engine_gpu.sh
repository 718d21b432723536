#!/usr/bin/env bash
# The GPU engine's runs (docs/performance.md explains them), from the repository root on one
# GPU: `PARTS="kernels offline anatomy tests" BASELINE=DIR bash bench/engine_gpu.sh`.
#   kernels   bench.attention_kernels: the extend kernel before vs now (TFLOP/s), a tile
#             sweep, decode, and greedy tokens of the engine, triton vs torch backend
#   sweep     bench.attention_kernels --grid-sweep: every extend tile on the workloads' shapes
#   offline   bench.offline's GPU workloads (256 x (512, 256); 1,024 requests sharing 16
#             prefixes) on dummy:llama-3-8b with defaults, this tree and, with BASELINE=DIR
#             (a copy of an earlier `radixmesh/` package tree, e.g. `git archive REV
#             radixmesh | tar -x -C DIR`), that tree first, in the same call
#   sampled   bench.offline's GPU workloads with every request sampling (temperature 0.7,
#             top-p 0.9), this tree and, with BASELINE=DIR, that tree first, in the same
#             call: the overlap scheduler with sampled rows (worker/overlap.py)
#   sampledanatomy bench.step_anatomy --workload prefill on the throughput workload with every
#             request sampling (temperature 0.7, top-p 0.9), this tree and, with
#             BASELINE=DIR, that tree first: each decode step's GPU idle time
#   json      bench.json_decode on dummy:llama-3-8b (256 documents, 64 running, jump-forward
#             on then off), this tree and, with BASELINE=DIR, that tree first, in the same
#             call: constrained requests under the overlap scheduler (worker/overlap.py)
#   offlinedefaults bench.offline's GPU workloads with the engine's own batch sizes (the
#             running cap and the graphs sized from the KV pool), as users get them
#   anatomy   bench.step_anatomy --workload prefill: each step kind's host phases and
#             kernels against its GPU span
#   tests     the GPU tests of the attention kernels, fused layers and the model
#   fp8sweep  the FP8 kernels' GPU tests (every small-batch variant at Llama-3-8B shapes),
#             then bench.fp8_gemm --sweep (bounded by --budget-s 200): lines to paste into
#             CONFIGS / ROW_CONFIGS of radixmesh/worker/layers/kernels/fp8_small_m.py
#   decode    bench.attention_kernels --decode-sweep (every decode launch on bf16 and FP8
#             pools at the workloads' shapes: what `decode_config` picks from) and the
#             attention kernels' tests on the GPU
#   detllama  bench.deterministic on dummy:llama-3-8b, bf16, every mode on and off,
#             batches to 256, chunked prefill at 2,048; and the deterministic kernels' tests
#   detsmol   bench.deterministic on the bundled model (SMOLLM2=path of its .gguf), bf16,
#             every mode on and off, batches to 256, chunked prefill at 2,048
#   detcost   bench.offline with --deterministic after `offline`: the mode's cost, same call
#   fp8p1     bench.tp --tp 1 --configs bf16,fp8-kv,fp8-all (fp8e2e's end-to-end half)
#   fp8e2e    bench.fp8_gemm (each path beside bf16 at 1-256 rows, effective TB/s), then
#             bench.tp --tp 1 --configs bf16,fp8,fp8-kv,fp8-all: throughput 256 x (512,
#             256), shared prefix and batch-1 time per token of each precision vs bf16
#   coldstart bench.cold_start: FP8 W+KV on dummy:llama-3-8b, warm-up on and off, each in
#             a process of its own with an empty Triton cache: engine start, the first
#             128/128 batch (1,024 requests) after start against the same batch again, and
#             every Triton compile by phase and step (each run's compiles and compile_log
#             in the JSON; the log lists the first batch's compiles after the warm-up)
#   coldmodules bench.cold_start with the warm-up on, CUDA's lazy module loading against
#             CUDA_MODULE_LOADING=EAGER, each in a process of its own: whether the first
#             batch's remaining cost is kernels loaded at their first launch
#   fp8cuda   the CUDA FP8 decode kernel's GPU tests, then bench.attention_kernels
#             --decode-sweep --quick: each decode path's default launch and the CUDA
#             kernel's launches on bf16 and FP8 pools, same call
#   fp8cudae2e bench.tp --tp 1: fp8-all with the Triton decode kernels
#             (RADIXMESH_FP8_DECODE=triton), then bf16 and fp8-all with the CUDA one (the
#             launch fp8cuda's sweep found fastest, when it ran first in the same call)
#   coldprofile bench.cold_start, FP8 W+KV, warm-up on, the scheduler synchronous, the host
#             parts under cProfile: the functions the first batch spends its extra host
#             time in (host_profile_gap)
#   overlapab bench.peer_shapes, FP8 W+KV, 128/128 at half TensorRT-LLM's requests, the
#             overlap scheduler on, then off (each an engine of its own): whether
#             overlap pays on that shape
#   peerdefaults bench.peer_shapes, FP8 W+KV, 128/128, 1000/1000 and 2048/2048 at half
#             TensorRT-LLM's request counts, with the engine's default batch sizes
#   moe       the grouped-GEMM experts' GPU tests (bf16, no sync; FP8 experts too), bench.moe
#             (Qwen3-30B-A3B's and Mixtral's sparse layer: the Triton experts against the
#             PyTorch loop; then again with --fp8: FP8 experts beside bf16 ones), and
#             the Qwen3-MoE model's test against transformers on the GPU, and the model
#             tests (Qwen3's fused norm + rotary, the MoE variants on CUDA)
#   sharedoffline bench.offline's GPU workloads as `offline` runs them, the shared-prefix
#             decode off, then on (RADIXMESH_SHARED_PREFIX_DECODE=1), then on with its
#             one-launch kernel (RADIXMESH_SHARED_PREFIX_FUSED=1): its end-to-end cost
#   fp8checks the FP8 paths' GPU tests, each file in a process of its own (a broken CUDA
#             context stops one file, not the rest): the GEMM table and the tensor-wise
#             epilogue, the CUDA small-batch GEMM, the fused quantization (equal bits),
#             the extend kernel over an FP8 pool with the new tokens written back (equal
#             bits), and the shared-prefix decode's (the files in parallel); then
#             bench.fp8_gemm (every path at 1-256 rows), bench.fp8_gemm --table (the engine's table for Llama-3-8B's shapes), bench.fused_ops --fp8-quant and
#             bench.attention_kernels' extend timings (FP8 written back vs the table), again
#             with RADIXMESH_FP8_EXTEND_F16=1 (the cached FP8 prefix's tiles as fp16)
#   fp8tests  fp8checks' tests alone (with the static activation scales'); fp8bench its
#             benchmarks alone
#   gemv      the CUDA small-batch FP8 GEMM's GPU tests (with the table's and the static
#             scales'), bench.fp8_gemm at 1-256 rows (at 1-16 every block size it compiles) and
#             --table, then bench.tp --tp 1 --configs fp8-all,bf16 (the engine with the
#             table measured at load: its batch-1 time per token against bf16's)
#   shared    the shared-prefix decode (kernels/decode_shared.py): its GPU tests, then
#             bench.attention_backends --backends triton,triton-shared,triton-shared-graph
#             (flat against shared, eager and as a graph launches it, on the shared
#             shapes, one layer's call, kernel time and do_bench), then bench.step_anatomy
#             --workload prefill with RADIXMESH_SHARED_PREFIX_DECODE off, on, and on
#             with the one-launch kernel (the shared_prefix workload's decode steps'
#             attention time)
# Results and logs go to $OUT. Python packages the machine lacks travel as wheels in .whl/
# (installed to /tmp/site). Bound a call with the per-run limits below, not a `timeout`
# around this script: that stops the shell, not the Python run it started, which then
# shares the GPU with whatever the call runs next (two engines on one GPU run out of memory).
set -u
PARTS=${PARTS:-"kernels offline anatomy tests"}
OUT=${OUT:-bench/results}; mkdir -p "$OUT"
source bench/gpu_machine.sh  # MACHINE
BASELINE=${BASELINE:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
SITE=${SITE:-}  # a folder of packages installed by an earlier call
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>/dev/null && SITE=/tmp/site
else
  echo "no .whl/ (bash bench/gpu_wheels.sh builds it): the machine's own packages only" >&2
fi
S=$(date +%s); el() { echo "[t=$(( $(date +%s) - S ))s] $*"; }
part() { [[ " $PARTS " == *" $1 "* ]]; }
run() {  # run LABEL TREE TIMEOUT ARGS...: python3 with TREE's radixmesh first on the path
  local label=$1 tree=$2 limit=$3; shift 3
  # PYTHONSAFEPATH: `python3 -m` would put the working directory (this tree) ahead of
  # PYTHONPATH, and a BASELINE run would import this tree's radixmesh, not the baseline's.
  PYTHONSAFEPATH=1 PYTHONPATH="$tree:$PWD${SITE:+:$SITE}" timeout "$limit" python3 "$@" \
    > "$OUT/$label.log" 2>&1
  echo "$label rc=$?"; tail -n 25 "$OUT/$label.log"; el "$label"
}
# The sizes the engine's defaults resolved to before the running cap and the graphs
# followed the KV pool, kept so that these runs compare with earlier ones (bench.offline's
# own defaults are the CPU workloads' 64 and 2,048).
OFFLINE="-m bench.offline --model dummy:llama-3-8b --device cuda --workloads gpu --kv-cache-bytes 0
  --max-running-requests 256 --max-num-batched-tokens 8192 --skip-baseline --skip-cache-off --repeats 2"

if part kernels; then
  run attention_kernels "$PWD" 240 -m bench.attention_kernels --out "$OUT/attention_kernels-$MACHINE.json"
fi
if part sweep; then
  run attention_sweep "$PWD" 400 -m bench.attention_kernels --grid-sweep \
    --out "$OUT/attention_sweep-$MACHINE.json"
fi
if part offline; then
  if [ -n "$BASELINE" ]; then
    run offline-before "$BASELINE" 200 $OFFLINE --out "$OUT/offline-before-$MACHINE.json"
  fi
  run offline-now "$PWD" 200 $OFFLINE --out "$OUT/offline-now-$MACHINE.json"
fi
if part sampled; then
  SAMPLED="$OFFLINE --temperature 0.7 --top-p 0.9"
  if [ -n "$BASELINE" ]; then
    run offline-sampled-before "$BASELINE" 200 $SAMPLED \
      --out "$OUT/offline-sampled-before-$MACHINE.json"
  fi
  run offline-sampled-now "$PWD" 200 $SAMPLED --out "$OUT/offline-sampled-now-$MACHINE.json"
fi
if part sampledanatomy; then
  SAMPLEDANATOMY="-m bench.step_anatomy --workload prefill --prefill-workloads throughput
    --temperature 0.7 --top-p 0.9"
  if [ -n "$BASELINE" ]; then
    run anatomy-sampled-before "$BASELINE" 300 $SAMPLEDANATOMY \
      --out "$OUT/step_anatomy-prefill-sampled-before-$MACHINE.json"
  fi
  run anatomy-sampled-now "$PWD" 300 $SAMPLEDANATOMY \
    --out "$OUT/step_anatomy-prefill-sampled-$MACHINE.json"
fi
if part json; then
  JSON="-m bench.json_decode --model dummy:llama-3-8b --device cuda --documents 256
    --max-running-requests 64 --max-new-tokens 400 --kv-cache-bytes 16000000000 --skip-mask"
  if [ -n "$BASELINE" ]; then
    run json-before "$BASELINE" 300 $JSON --out "$OUT/json_decode-before-$MACHINE.json"
  fi
  run json-now "$PWD" 300 $JSON --out "$OUT/json_decode-now-$MACHINE.json"
fi
if part offlinedefaults; then
  run offline-defaults "$PWD" 200 -m bench.offline --model dummy:llama-3-8b --device cuda \
    --workloads gpu --kv-cache-bytes 0 --max-running-requests 0 --max-num-batched-tokens 0 \
    --cuda-graph-max-batch-size -1 --skip-baseline --skip-cache-off --repeats 2 \
    --out "$OUT/offline-defaults-$MACHINE.json"
fi
if part detcost; then
  run offline-deterministic "$PWD" 200 $OFFLINE --deterministic \
    --out "$OUT/offline-deterministic-now-$MACHINE.json"
fi
if part fp8p1; then
  run tp-fp8 "$PWD" 360 -m bench.tp --tp 1 --configs bf16,fp8-kv,fp8-all \
    --out "$OUT/tp-fp8-$MACHINE.json"
fi
if part anatomy; then
  run step_anatomy "$PWD" 200 -m bench.step_anatomy --workload prefill \
    --out "$OUT/step_anatomy-prefill-$MACHINE.json"
fi
if part fp8sweep; then
  run fp8-gpu-tests "$PWD" 200 -m pytest -q -m gpu -p no:cacheprovider \
    tests/worker/layers/kernels/test_fp8_small_m.py \
    tests/worker/layers/kernels/test_fp8_small_m_variants.py tests/worker/layers/quantization
  run fp8_sweep "$PWD" 330 -m bench.fp8_gemm --sweep --budget-s 200 \
    --out "$OUT/fp8_gemm-sweep-$MACHINE.json"
fi
if part decode; then
  run decode_sweep "$PWD" 420 -m bench.attention_kernels --decode-sweep \
    --out "$OUT/attention_decode_sweep-$MACHINE.json"
  run attention-gpu-tests "$PWD" 200 -m pytest -q -p no:cacheprovider \
    tests/worker/attention/test_triton_kernels.py
fi
if part detllama; then
  run deterministic-kernel-tests "$PWD" 200 -m pytest -q -p no:cacheprovider \
    tests/worker/attention/test_deterministic_kernels.py
  run deterministic-llama "$PWD" 400 -m bench.deterministic --model dummy:llama-3-8b \
    --dtype bfloat16 --device cuda --trials 2 --batch-sizes 1,2,4,8,16,32,64,128,256 \
    --max-num-batched-tokens 2048 --kv-cache-tokens 400000 \
    --out "$OUT/deterministic-llama-3-8b-$MACHINE.json"
fi
if part detsmol; then
  run deterministic-smollm2 "$PWD" 500 -m bench.deterministic --model "$SMOLLM2" \
    --dtype bfloat16 --device cuda --trials 2 --batch-sizes 1,2,4,8,16,32,64,128,256 \
    --max-num-batched-tokens 2048 --name smollm2-bfloat16 \
    --out "$OUT/deterministic-smollm2-bfloat16-$MACHINE.json"
fi
if part fp8e2e; then
  run fp8_gemm "$PWD" 120 -m bench.fp8_gemm --rows 1,4,16,64,256 --out "$OUT/fp8_gemm-$MACHINE.json"
  run tp-fp8 "$PWD" 420 -m bench.tp --tp 1 --configs bf16,fp8,fp8-kv,fp8-all \
    --out "$OUT/tp-fp8-$MACHINE.json"
fi
if part coldstart; then
  run cold_start "$PWD" 420 -m bench.cold_start --configs fp8-all --warmup on,off \
    --out "$OUT/cold_start-$MACHINE.json"
fi
if part coldmodules; then
  run cold_start_modules "$PWD" 420 -m bench.cold_start --configs fp8-all --warmup on \
    --module-loading eager,lazy --out "$OUT/cold_start-modules-$MACHINE.json"
fi
if part coldprofile; then
  run cold_start_profile "$PWD" 420 -m bench.cold_start --configs fp8-all --warmup on \
    --overlap off --host-profile 25 --out "$OUT/cold_start-profile-$MACHINE.json"
fi
if part overlapab; then
  run peer_shapes_overlap "$PWD" 540 -m bench.peer_shapes --configs fp8-all --shapes 128/128 \
    --requests-scale 0.5 --overlap on,off --out "$OUT/peer_shapes-overlap-$MACHINE.json"
fi
if part peerdefaults; then
  run peer_shapes "$PWD" 540 -m bench.peer_shapes --configs fp8-all \
    --shapes 128/128,1000/1000,2048/2048 --requests-scale 0.5 \
    --out "$OUT/peer_shapes-defaults-$MACHINE.json"
fi
if part fp8cuda; then
  run fp8-cuda-tests "$PWD" 240 -m pytest -q -p no:cacheprovider \
    tests/worker/attention/test_decode_fp8_cuda.py
  run decode_quick "$PWD" 240 -m bench.attention_kernels --decode-sweep --quick \
    --out "$OUT/attention_decode_quick-$MACHINE.json"
fi
if part fp8cudae2e; then
  # The CUDA launch the decode sweep found fastest (geometric mean over its batch-256 and
  # batch-64 shapes), when the sweep ran in this call.
  if [ -f "$OUT/attention_decode_quick-$MACHINE.json" ]; then
    export RADIXMESH_FP8_DECODE=$(python3 -m bench.fp8_decode_launch \
      "$OUT/attention_decode_quick-$MACHINE.json")
    echo "FP8 decode launch: $RADIXMESH_FP8_DECODE"
  fi
  CUDA_LAUNCH=${RADIXMESH_FP8_DECODE:-cuda}
  export RADIXMESH_FP8_DECODE=triton
  run tp-fp8-triton-decode "$PWD" 300 -m bench.tp --tp 1 --configs fp8-all \
    --out "$OUT/tp-fp8-triton-decode-$MACHINE.json"
  export RADIXMESH_FP8_DECODE=$CUDA_LAUNCH
  run tp-fp8 "$PWD" 360 -m bench.tp --tp 1 --configs bf16,fp8-all \
    --out "$OUT/tp-fp8-$MACHINE.json"
  unset RADIXMESH_FP8_DECODE
fi
if part fp8checks || part fp8tests; then
  for t in tests/worker/layers/quantization/test_fp8_gemm_choice.py \
      tests/worker/layers/kernels/test_fp8_epilogue.py \
      tests/worker/layers/kernels/test_fp8_gemv_cuda.py \
      tests/worker/layers/kernels/test_fused_fp8_quant.py \
      tests/worker/layers/quantization/test_fp8_fused_quant.py \
      tests/worker/layers/quantization/test_fp8_static.py \
      tests/worker/attention/test_extend_paths.py tests/worker/attention/test_triton_backend.py \
      tests/worker/attention/test_decode_shared.py; do
    # In parallel: the files are independent and mostly compile Triton kernels (CPU work).
    run "gpu-$(basename "$t" .py)" "$PWD" 200 -m pytest -q -p no:cacheprovider "$t" &
  done
  wait
fi
if part fp8checks || part fp8bench; then
  run fp8_gemm_table "$PWD" 240 -m bench.fp8_gemm --table --out "$OUT/fp8_gemm-table-$MACHINE.json"
  run fused_ops_fp8 "$PWD" 120 -m bench.fused_ops --fp8-quant \
    --out "$OUT/fused_ops-fp8quant-$MACHINE.json"
  run attention_kernels "$PWD" 240 -m bench.attention_kernels --skip-sweep --skip-engine \
    --out "$OUT/attention_kernels-$MACHINE.json"
  export RADIXMESH_FP8_EXTEND_F16=1  # the FP8 prefix's tiles as fp16 (extend_attention.py)
  run attention_kernels_fp8f16 "$PWD" 240 -m bench.attention_kernels --skip-sweep \
    --skip-engine --out "$OUT/attention_kernels-fp8-prefix-f16-$MACHINE.json"
  unset RADIXMESH_FP8_EXTEND_F16
  run fp8_gemm "$PWD" 150 -m bench.fp8_gemm --rows 1,4,8,16,64,256 \
    --out "$OUT/fp8_gemm-$MACHINE.json"
fi
if part gemv; then
  for t in tests/worker/layers/kernels/test_fp8_gemv_cuda.py \
      tests/worker/layers/quantization/test_fp8_gemm_choice.py \
      tests/worker/layers/quantization/test_fp8_static.py; do
    run "gpu-$(basename "$t" .py)" "$PWD" 200 -m pytest -q -p no:cacheprovider "$t" &
  done
  wait
  run fp8_gemm "$PWD" 150 -m bench.fp8_gemm --rows 1,2,4,8,16,64,256 \
    --out "$OUT/fp8_gemm-$MACHINE.json"
  run fp8_gemm_table "$PWD" 240 -m bench.fp8_gemm --table --out "$OUT/fp8_gemm-table-$MACHINE.json"
  run tp-fp8 "$PWD" 240 -m bench.tp --tp 1 --configs fp8-all,bf16 \
    --out "$OUT/tp-fp8-$MACHINE.json"
fi
if part shared; then
  part fp8checks || part fp8tests || run gpu-test_decode_shared "$PWD" 200 -m pytest -q -p no:cacheprovider \
    tests/worker/attention/test_decode_shared.py tests/worker/attention/test_triton_backend.py \
    tests/worker/attention/test_shared_prefix.py
  run gpu-test_shared_graphs "$PWD" 400 -m pytest -q -p no:cacheprovider -m gpu \
    tests/worker/attention/test_triton_engine.py
  run attention_backends_shared "$PWD" 300 -m bench.attention_backends \
    --backends triton,triton-shared,triton-shared-graph,triton-shared-fused \
    --out "$OUT/attention_backends-shared-$MACHINE.json"
  run step_anatomy_flat "$PWD" 240 -m bench.step_anatomy --workload prefill \
    --out "$OUT/step_anatomy-prefill-$MACHINE.json"
  export RADIXMESH_SHARED_PREFIX_DECODE=1
  run step_anatomy_shared "$PWD" 240 -m bench.step_anatomy --workload prefill \
    --out "$OUT/step_anatomy-prefill-shared-decode-$MACHINE.json"
  RADIXMESH_SHARED_PREFIX_FUSED=1 run step_anatomy_fused "$PWD" 240 -m bench.step_anatomy \
    --workload prefill --out "$OUT/step_anatomy-prefill-shared-fused-$MACHINE.json"
  unset RADIXMESH_SHARED_PREFIX_DECODE
fi
if part sharedoffline; then
  run offline-flat "$PWD" 200 $OFFLINE --out "$OUT/offline-$MACHINE.json"
  RADIXMESH_SHARED_PREFIX_DECODE=1 run offline-shared "$PWD" 200 $OFFLINE \
    --out "$OUT/offline-shared-decode-$MACHINE.json"
  RADIXMESH_SHARED_PREFIX_DECODE=1 RADIXMESH_SHARED_PREFIX_FUSED=1 run offline-fused "$PWD" \
    200 $OFFLINE --out "$OUT/offline-shared-fused-$MACHINE.json"
fi
if part moe; then
  run gpu-test_moe "$PWD" 240 -m pytest -q -p no:cacheprovider \
    tests/worker/layers/kernels/test_fused_moe.py tests/worker/layers/test_moe.py \
    tests/worker/layers/kernels/test_fused_moe_fp8.py \
    tests/worker/model/test_llama.py tests/worker/layers/kernels/test_fused_kernels.py
  run moe "$PWD" 300 -m bench.moe --out "$OUT/moe-$MACHINE.json"
  run moe-fp8 "$PWD" 300 -m bench.moe --fp8 --out "$OUT/moe-fp8-$MACHINE.json"
fi
if part tests; then
  run gpu-tests "$PWD" 300 -m pytest -q -m gpu -p no:cacheprovider tests/worker/attention \
    tests/worker/layers/kernels tests/worker/model/test_llama.py
fi
