#!/usr/bin/env bash
# The flashinfer backend's GPU runs, from the repository root on one GPU:
#   PARTS="jit tests kernels offline" bash bench/flashinfer_gpu.sh
#   jit      compile_kernels for Llama-3-8B's heads (32/8/128, bf16) cold, then again warm
#            (the on-disk cache); its seconds are the worker's start-up cost
#   tests    the GPU tests of the flashinfer backend, the index kernel, the CUDA graphs
#   kernels  bench.attention_backends --engine: triton vs flashinfer per layer call, same
#            inputs, then the engine's batch-1 time per token with each
#   offline  bench.offline's GPU workloads on dummy:llama-3-8b, triton then flashinfer
# FlashInfer travels as .fi/flashinfer-*-slim.tar.xz, made by bench/flashinfer_bundle.sh
# (the package less its sources for other GPUs and models, 13 MB; docs/performance.md,
# "Running the GPU benchmarks"), the project's other missing packages as wheels in .whl/.
# Compiled modules found in .fi/aot/ (a tarball an earlier run left in $OUT) are installed
# as FlashInfer's AOT modules and skip the JIT; this run's are packed into
# $OUT/flashinfer-aot.tar.xz.
set -u
PARTS=${PARTS:-"jit tests kernels offline"}
OUT=${OUT:-bench/results}; mkdir -p "$OUT"
MACHINE=${MACHINE:-h200}
SITE=/tmp/site
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
S=$(date +%s); el() { echo "[t=$(( $(date +%s) - S ))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target $SITE .whl/*.whl 2>/dev/null || exit 1
tar -xJf .fi/flashinfer-*-slim.tar.xz -C $SITE || exit 1
mkdir -p $SITE/flashinfer/data/aot
for t in .fi/aot/*.tar.xz; do [ -f "$t" ] && tar -xJf "$t" -C $SITE/flashinfer/data/aot; done
export PYTHONPATH=$PWD:$SITE
el "installed"
part() { [[ " $PARTS " == *" $1 "* ]]; }
run() {  # run LABEL TIMEOUT ARGS...
  local label=$1 limit=$2; shift 2
  PYTHONSAFEPATH=1 timeout "$limit" python3 "$@" > "$OUT/$label.log" 2>&1
  echo "$label rc=$?"; tail -n 30 "$OUT/$label.log"; el "$label"
}
if part jit; then
  run jit 400 -c "
import logging, torch
logging.basicConfig(level=logging.INFO)
from radixmesh.worker.attention.flashinfer_backend import compile_kernels
for i in range(2):
    print('compile_kernels', ['cold', 'warm'][i], round(compile_kernels(32, 8, 128, torch.bfloat16, torch.device('cuda')), 1), 's')
"
fi
if part tests; then
  run tests 400 -m pytest -q -p no:cacheprovider tests/worker/attention/test_flashinfer_backend.py \
    tests/worker/attention/test_kv_indices.py tests/worker/test_cuda_graph.py tests/worker/attention/test_selection.py \
    "tests/worker/test_engine.py::test_two_engines_in_turn_each_take_the_whole_gpu"
fi
if part kernels; then
  run attention_backends 400 -m bench.attention_backends --engine --out "$OUT/attention_backends-$MACHINE.json"
fi
OFFLINE="-m bench.offline --model dummy:llama-3-8b --device cuda --workloads gpu --kv-cache-bytes 0
  --max-running-requests 256 --max-num-batched-tokens 8192 --skip-baseline --skip-cache-off --repeats 2"
if part offline; then
  for b in triton flashinfer; do
    run offline-$b 420 $OFFLINE --attention-backend $b --out "$OUT/offline-$b-$MACHINE.json"
  done
fi
# The modules this run compiled, as AOT modules for the next run (.fi/aot/).
(cd $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer 2>/dev/null && \
  find . -name '*.so' -path '*cached_ops*' | head -20 > /tmp/so.txt && cat /tmp/so.txt && \
  mkdir -p /tmp/aot && while read -r f; do n=$(basename "$f" .so); mkdir -p /tmp/aot/$n; cp "$f" /tmp/aot/$n/; done < /tmp/so.txt && \
  tar -cJf "$OUT/flashinfer-aot.tar.xz" -C /tmp/aot . && ls -la "$OUT/flashinfer-aot.tar.xz")
el "done"
