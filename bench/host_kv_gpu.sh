#!/usr/bin/env bash
# The host-memory KV tier's GPU runs, from the repository root on one GPU:
#   PARTS="tests bench" bash bench/host_kv_gpu.sh
#   tests  the tier's tests (its CUDA copy kernel over pinned memory among them)
#   bench  bench.host_kv: the copy kernel's bandwidth, then multi-turn chat on
#          dummy:llama-3-8b with a shrunk device pool, with and without the tier
# The project's missing packages travel as wheels in .whl/ (docs/performance.md,
# "Running the GPU benchmarks").
set -u
PARTS=${PARTS:-"tests bench"}
OUT=${OUT:-bench/results}; mkdir -p "$OUT"
MACHINE=${MACHINE:-h200}
SITE=/tmp/site
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
S=$(date +%s); el() { echo "[t=$(( $(date +%s) - S ))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target $SITE .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:$SITE
el "installed"
part() { [[ " $PARTS " == *" $1 "* ]]; }
run() {  # run LABEL TIMEOUT ARGS...
  local label=$1 limit=$2; shift 2
  PYTHONSAFEPATH=1 timeout "$limit" python3 "$@" > "$OUT/$label.log" 2>&1
  echo "$label rc=$?"; tail -n 30 "$OUT/$label.log"; el "$label"
}
if part tests; then
  run host-tests 300 -m pytest -q -p no:cacheprovider tests/worker/kvcache/test_host_tier.py \
    tests/worker/kvcache/test_tier_properties.py
fi
if part bench; then
  run host_kv 480 -m bench.host_kv --model dummy:llama-3-8b --device cuda ${BENCH_ARGS:-} \
    --out "$OUT/host_kv-$MACHINE.json"
fi
