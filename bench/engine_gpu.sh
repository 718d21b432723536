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
#   anatomy   bench.step_anatomy --workload prefill: each step kind's host phases and
#             kernels against its GPU span
#   tests     the GPU tests of the attention kernels, fused layers and the model
# Results and logs go to $OUT. Python packages the machine lacks travel as wheels in .whl/
# (installed to /tmp/site).
set -u
PARTS=${PARTS:-"kernels offline anatomy tests"}
OUT=${OUT:-bench/results}; mkdir -p "$OUT"
MACHINE=${MACHINE:-h200}
BASELINE=${BASELINE:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
SITE=""
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>/dev/null && SITE=/tmp/site
fi
S=$(date +%s); el() { echo "[t=$(( $(date +%s) - S ))s] $*"; }
part() { [[ " $PARTS " == *" $1 "* ]]; }
run() {  # run LABEL TREE TIMEOUT ARGS...: python3 with TREE's radixmesh first on the path
  local label=$1 tree=$2 limit=$3; shift 3
  PYTHONPATH="$tree:$PWD${SITE:+:$SITE}" timeout "$limit" python3 "$@" > "$OUT/$label.log" 2>&1
  echo "$label rc=$?"; tail -n 25 "$OUT/$label.log"; el "$label"
}
# The engine's own defaults (bench.offline's are the CPU workloads' 64 and 2,048).
OFFLINE="-m bench.offline --model dummy:llama-3-8b --device cuda --workloads gpu --kv-cache-bytes 0
  --max-running-requests 256 --max-num-batched-tokens 8192 --skip-baseline --repeats 2"

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
if part anatomy; then
  run step_anatomy "$PWD" 200 -m bench.step_anatomy --workload prefill \
    --out "$OUT/step_anatomy-prefill-$MACHINE.json"
fi
if part tests; then
  run gpu-tests "$PWD" 300 -m pytest -q -m gpu -p no:cacheprovider tests/worker/attention \
    tests/worker/layers/kernels tests/worker/model/test_llama.py
fi
