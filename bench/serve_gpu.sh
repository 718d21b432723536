#!/usr/bin/env bash
# The serving benchmark's GPU runs (docs/performance.md explains each), from the repository
# root on a GPU machine: `PARTS="policies random" bash bench/serve_gpu.sh`. Results (JSON and
# plots) and logs go to $OUT (default bench/results). Two workers share GPU 0 unless
# GPUS=2 gives each its own; each worker's KV pool is fixed (KV_TOKENS), so the shared-prefix
# set (GROUPS x PREFIX tokens) is larger than one worker's pool and placement decides hits.
# Python packages the machine lacks travel as wheels in .whl/ (installed to /tmp/site).
set -u
PARTS=${PARTS:-"single router policies turns random"}
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
OFFLINE="python3 -m bench.serve --offline --model $MODEL --out-dir $OUT"
P1="--workload random --num-requests 256 --input-len 512 --output-len 256"

# One worker on the whole GPU, every engine option at its default, on P1 (256 requests of
# 512 random tokens, 256 out): the offline engine with defaults and with the tuned sizes,
# then the worker serving the same workload through the router over HTTP and gRPC and
# straight to its gRPC port, at 64 and 256 concurrent streams (serving overhead, router cost).
if part single; then
  timeout 150 $OFFLINE $P1 --repeats 3 --name "offline-defaults-$MACHINE" \
    > "$OUT/offline-defaults.log" 2>&1
  echo "offline defaults rc=$?"; tail -1 "$OUT/offline-defaults.log"; el offline-defaults
  timeout 150 $OFFLINE $P1 --repeats 3 --name "offline-tuned-$MACHINE" \
    --worker-args "--max-running-requests 256 --max-num-batched-tokens 8192" \
    > "$OUT/offline-tuned.log" 2>&1
  echo "offline tuned rc=$?"; tail -1 "$OUT/offline-tuned.log"; el offline-tuned
  timeout 280 $SERVE --workers 1 $P1 --backend openai-completions,grpc,grpc-direct \
    --concurrency 64,256 --name "single-worker-$MACHINE" > "$OUT/single.log" 2>&1
  echo "single rc=$?"; grep -A7 "^workload" "$OUT/single.log" | tail -7; el single
fi
# The GIL's switch interval in the worker (its scheduler thread and its gRPC event loop
# share one interpreter): P1 at 256 streams straight to one worker, Python's default 5 ms
# against 0.5 ms.
if part gil; then
  for si in 0.005 0.0005; do
    port=$((50100 + ${#si}))
    python3 -c "import sys; sys.setswitchinterval($si); from radixmesh.cluster.cli import main; \
      sys.exit(main(['worker', '--model', '$MODEL', '--port', '$port']))" > "$OUT/gil-$si.log" 2>&1 &
    W=$!
    timeout 200 python3 -m bench.serve --grpc 127.0.0.1:$port --backend grpc $P1 --concurrency 256 \
      --ready-timeout 180 --name "gil-$si-$MACHINE" --out-dir "$OUT" >> "$OUT/gil-$si.log" 2>&1
    echo "gil $si rc=$?"; grep -A1 "^workload" "$OUT/gil-$si.log" | tail -1; kill $W; wait $W; el "gil $si"
  done
fi
# The router's own cost: 512 short requests (64 tokens in, 32 out) at 64 concurrent streams
# through the router and straight to one worker, alternating (the first run warms up).
if part router; then
  timeout 200 $SERVE --workers 1 --workload random --num-requests 512 --input-len 64 \
    --output-len 32 --concurrency 64 --backend grpc,grpc-direct,grpc,grpc-direct,grpc \
    --name "router-cost-$MACHINE" > "$OUT/router.log" 2>&1
  echo "router rc=$?"; grep -A4 "^workload" "$OUT/router.log" | tail -4; el router
fi
# Routing policies on the shared-prefix workload: 24 prefixes of 4,096 tokens (98k tokens,
# more than one worker's 64k pool), 8 questions each, at a sweep of request rates.
if part policies; then
  timeout 400 $SERVE --workers 2 --worker-args "$WORKER" --name "shared-prefix-$MACHINE" \
    --policies "${POLICIES:-cache_aware,round_robin}" --workload shared-prefix \
    --groups 24 --num-requests 192 --prefix-len 4096 --question-len 64 --output-len 128 \
    --rates "${RATES:-8,12,16,20,24,inf}" > "$OUT/policies.log" 2>&1
  echo "policies rc=$?"; grep -A14 "^workload" "$OUT/policies.log" | tail -14; el policies
fi
# Multi-turn chats (24 conversations of 4 turns over a 2,048-token system prompt each,
# 1 s think time, over gRPC: the replies' ids are resent) and the language's programs
# (through RuntimeEndpoint), with each policy.
if part turns; then
  timeout 190 $SERVE --workers 2 --worker-args "$WORKER" --name "multi-turn-$MACHINE" \
    --policies cache_aware,round_robin,least_load --backend grpc --workload multi-turn,programs \
    --num-requests 96 --turns 4 --prefix-len 2048 --question-len 64 --output-len 64 \
    --think-time 1.0 --rates 6 > "$OUT/turns.log" 2>&1
  echo "turns rc=$?"; grep -A8 "^workload" "$OUT/turns.log" | tail -9; el turns
fi
# No sharing (the control): P1 at 16 req/s and all at once.
if part random; then
  timeout 150 $SERVE --workers 2 --worker-args "$WORKER" --name "random-$MACHINE" \
    --policies cache_aware,round_robin $P1 --rates 16,inf > "$OUT/random.log" 2>&1
  echo "random rc=$?"; grep -A4 "^workload" "$OUT/random.log" | tail -4; el random
fi
