#!/usr/bin/env bash
# The serving benchmark's GPU runs (docs/performance.md explains each), from the repository
# root on a GPU machine: `PARTS="policies random" bash bench/serve_gpu.sh`. Results (JSON and
# plots) and logs go to $OUT (default bench/results). Two workers share GPU 0 unless
# GPUS=2 gives each its own; each worker's KV pool is fixed (KV_TOKENS), so the shared-prefix
# set (GROUPS x PREFIX tokens) is larger than one worker's pool and placement decides hits.
# Python packages the machine lacks travel as wheels in .whl/ (installed to /tmp/site).
set -u
PARTS=${PARTS:-"policies random"}
OUT=${OUT:-bench/results}; mkdir -p "$OUT"
MODEL=${MODEL:-dummy:llama-3-8b}
GPUS=${GPUS:-1}
KV_TOKENS=${KV_TOKENS:-64000}
MACHINE=${MACHINE:-h200}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD
fi
S=$(date +%s); el() { echo "[t=$(( $(date +%s) - S ))s] $*"; }
part() { [[ " $PARTS " == *" $1 "* ]]; }
per_gpu=""; [ "$GPUS" = 1 ] || per_gpu="--gpus-per-worker 1"
WORKER="--kv-cache-tokens $KV_TOKENS --max-running-requests 128 --max-num-batched-tokens 8192"
SERVE="python3 -m bench.serve --launch --model $MODEL --out-dir $OUT $per_gpu"

# Routing policies on the shared-prefix workload: 24 prefixes of 4,096 tokens (98k tokens,
# more than one worker's 64k pool), 8 questions each, at a sweep of request rates.
if part policies; then
  timeout 400 $SERVE --workers 2 --worker-args "$WORKER" --name "shared-prefix-$MACHINE" \
    --policies cache_aware,round_robin,least_load --workload shared-prefix \
    --groups 24 --num-requests 192 --prefix-len 4096 --question-len 64 --output-len 128 \
    --rates 8,16,inf > "$OUT/policies.log" 2>&1
  echo "policies rc=$?"; grep -E "^(shared|workload)" "$OUT/policies.log" | tail -10; el policies
fi
# No sharing (the control): 256 x (512 in, 256 out), all at once and at 16 req/s.
if part random; then
  timeout 150 $SERVE --workers 2 --worker-args "$WORKER" --name "random-$MACHINE" \
    --policies cache_aware,round_robin --workload random --num-requests 256 \
    --input-len 512 --output-len 256 --rates 16,inf > "$OUT/random.log" 2>&1
  echo "random rc=$?"; grep -E "^(random|workload)" "$OUT/random.log" | tail -5; el random
fi
