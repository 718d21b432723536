#!/usr/bin/env bash
# The router tier's GPU runs (docs/router-tier.md and docs/performance.md explain them), from
# the repository root on one GPU: `PARTS="small replicas" bash bench/router_tier_gpu.sh`.
# Results (JSON and plots) and logs go to $OUT (default bench/results).
#   small     four small-model workers sharing the GPU, one router: 2,048 requests of 256
#             random tokens in and 128 out, 512 concurrent, over unary gRPC, streamed gRPC and
#             streamed HTTP, through the router and straight to the workers (the same load
#             spread over them), each with the router's CPU seconds per 1,000 output tokens
#   replicas  the same cluster with $ROUTERS router replicas sharing the router's ports
#   big       one Llama-3-8B-shaped worker on the whole GPU: 512 x (256, 128), 512
#             concurrent, unary and streamed gRPC through the router and direct
# Python packages the machine lacks travel as wheels in .whl/ (installed to /tmp/site).
set -u
PARTS=${PARTS:-"small replicas"}
OUT=${OUT:-bench/results}; mkdir -p "$OUT"
MACHINE=${MACHINE:-h200}
ROUTERS=${ROUTERS:-4}
CONNECTIONS=${CONNECTIONS:-8}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD
fi
S=$(date +%s); el() { echo "[t=$(( $(date +%s) - S ))s] $*"; }
part() { [[ " $PARTS " == *" $1 "* ]]; }
SMALL="python3 -m bench.serve --launch --model dummy:smollm2-135m --workers 4 --out-dir $OUT \
  --worker-args=--gpu-memory-share=0.2 --workload random --num-requests 2048 --input-len 256 \
  --output-len 128 --concurrency 512 --connections $CONNECTIONS --warmup 64"
if part small; then
  timeout 330 $SMALL --routers 1 --name "router-tier-r1-$MACHINE" \
    --backend grpc-unary-direct,grpc-unary,grpc-direct,grpc,openai-completions \
    > "$OUT/router-tier-r1.log" 2>&1
  echo "small rc=$?"; grep -A5 "^workload" "$OUT/router-tier-r1.log" | tail -6; el small
fi
if part replicas; then
  timeout 240 $SMALL --routers "$ROUTERS" --name "router-tier-r$ROUTERS-$MACHINE" \
    --backend grpc-unary,grpc,openai-completions,grpc-unary-direct \
    > "$OUT/router-tier-r$ROUTERS.log" 2>&1
  echo "replicas rc=$?"; grep -A4 "^workload" "$OUT/router-tier-r$ROUTERS.log" | tail -5
  el replicas
fi
if part big; then
  timeout 400 python3 -m bench.serve --launch --model dummy:llama-3-8b --workers 1 \
    --out-dir "$OUT" --workload random --num-requests 512 --input-len 256 --output-len 128 \
    --concurrency 512 --warmup 32 --name "router-tier-8b-$MACHINE" \
    --backend grpc-unary-direct,grpc-unary,grpc-direct,grpc > "$OUT/router-tier-8b.log" 2>&1
  echo "big rc=$?"; grep -A4 "^workload" "$OUT/router-tier-8b.log" | tail -5; el big
fi
