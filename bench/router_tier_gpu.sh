#!/usr/bin/env bash
# The router tier's GPU runs (docs/router-tier.md and docs/performance.md explain them), from
# the repository root on one GPU: `PARTS="small replicas" bash bench/router_tier_gpu.sh`.
# Each part starts a cluster with `radixmesh launch` and drives it with bench.serve, which
# records throughput and the router processes' CPU seconds per 1,000 output tokens:
#   small     four small-model workers sharing the GPU (--workers-per-gpu 4), one router:
#             2,048 requests of 256 random tokens in and 128 out, 512 concurrent, over unary
#             gRPC, streamed gRPC and streamed HTTP through the router, and the gRPC loads
#             straight to the workers (spread over them)
#   replicas  the same with $ROUTERS router replicas sharing the router's ports
#   streams   one router reading the workers' output streams (the default) against one
#             reading each request's own call (--per-request-streams), same load
#   hits      cache-aware hit rate through 1, 2 and 4 router replicas (--routers) on the
#             shared-prefix workload (24 prefixes of 4,096 tokens: more than one worker's
#             32,000-token pool, less than four) and multi-turn chats, four small workers
#   big       one Llama-3-8B-shaped worker on the whole GPU: 512 x (256, 128), 512
#             concurrent, unary and streamed gRPC through the router and direct
# With BASELINE=DIR (a copy of an earlier `radixmesh/` package tree, e.g. `git archive REV
# radixmesh | tar -x -C DIR`), `small` and `big` also run that code's cluster first, driven by
# the same bench: the side-by-side comparison. Results and logs go to $OUT.
# Python packages the machine lacks travel as wheels in .whl/ (installed to /tmp/site).
set -u
PARTS=${PARTS:-"small replicas"}
OUT=${OUT:-bench/results}; mkdir -p "$OUT"
MACHINE=${MACHINE:-h200}
ROUTERS=${ROUTERS:-4}
CONNECTIONS=${CONNECTIONS:-2}
CLIENT_PROCS=${CLIENT_PROCS:-6}
BASELINE=${BASELINE:-}
PY=${PY:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export RADIXMESH_WORKER_API_KEY=${RADIXMESH_WORKER_API_KEY:-router-tier-bench}
SITE=""
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>/dev/null && SITE=/tmp/site
fi
S=$(date +%s); el() { echo "[t=$(( $(date +%s) - S ))s] $*"; }
part() { [[ " $PARTS " == *" $1 "* ]]; }

# cluster NAME CODE_ROOT LAUNCH_ARGS...: start `radixmesh launch` from CODE_ROOT's package in
# the background and wait until it is ready; sets PID, WORKERS_AT and ROUTER_PIDS.
cluster() {
  local name=$1 root=$2; shift 2
  # PYTHONSAFEPATH (inherited by the launched processes): `-m` would put the working
  # directory (this tree) ahead of CODE_ROOT, so a BASELINE cluster would run this tree.
  PYTHONSAFEPATH=1 PYTHONPATH="$SITE:$root" $PY -m radixmesh.cluster.cli launch --port 51050 \
    --http-port 51080 "$@" > "$OUT/router-tier-$name-cluster.log" 2>&1 &
  PID=$!
  for _ in $(seq 300); do
    grep -q "cluster ready" "$OUT/router-tier-$name-cluster.log" && break
    kill -0 $PID 2>/dev/null || break
    sleep 1
  done
  WORKERS_AT=$(sed -n 's/.*workers \(.*\)$/\1/p' "$OUT/router-tier-$name-cluster.log" | tr -d ' ')
  ROUTER_PIDS=$(pgrep -d, -f "cluster.cli router .*--port 51050 ")
  el "cluster $name ready: workers $WORKERS_AT, routers $ROUTER_PIDS"
}
stop_cluster() { kill -TERM $PID; wait $PID; sleep 2; }
# drive NAME BENCH_ARGS...: bench.serve against the running cluster.
drive() {
  local name=$1; shift
  PYTHONPATH="$SITE:$PWD" timeout 300 $PY -m bench.serve --grpc 127.0.0.1:51050 \
    --http http://127.0.0.1:51080 --router-pids "$ROUTER_PIDS" --workers-at "$WORKERS_AT" \
    --workload random --connections "$CONNECTIONS" --client-procs "$CLIENT_PROCS" --out-dir "$OUT" \
    --name "router-tier-$name-$MACHINE" "$@" > "$OUT/router-tier-$name.log" 2>&1
  echo "$name rc=$?"; grep -A6 "^workload" "$OUT/router-tier-$name.log" | tail -7; el "$name"
}
SMALL_LOAD="--num-requests ${SMALL_REQUESTS:-2048} --input-len 256 --output-len 128 --concurrency 512 --warmup 64"
SMALL_CLUSTER="--model ${SMALL_MODEL:-dummy:smollm2-135m} --workers 4 --workers-per-gpu 4"
BIG_LOAD="--num-requests 512 --input-len 256 --output-len 128 --concurrency 512 --warmup 32"
if part small; then
  if [ -n "$BASELINE" ]; then
    cluster small-base "$BASELINE" $SMALL_CLUSTER
    drive small-base $SMALL_LOAD --backend grpc-unary,grpc,openai-completions
    stop_cluster
  fi
  cluster small "$PWD" $SMALL_CLUSTER
  drive small $SMALL_LOAD \
    --backend grpc-unary-direct,grpc-unary,grpc-direct,grpc,openai-completions
  stop_cluster
fi
if part replicas; then
  cluster "small-r$ROUTERS" "$PWD" $SMALL_CLUSTER --routers "$ROUTERS"
  drive "small-r$ROUTERS" $SMALL_LOAD --backend grpc-unary,grpc,openai-completions
  stop_cluster
fi
if part streams; then
  for mode in ${STREAM_MODES:-output-streams per-request-streams}; do
    flag=""; [ $mode = per-request-streams ] && flag="--per-request-streams"
    cluster "small-$mode" "$PWD" $SMALL_CLUSTER $flag
    drive "small-$mode" $SMALL_LOAD --backend grpc-unary,grpc,openai-completions
    stop_cluster
  done
fi
if part hits; then
  for r in ${HIT_ROUTERS:-1 2 4}; do
    PYTHONPATH="$SITE:$PWD" timeout 200 $PY -m bench.serve --launch --model "${SMALL_MODEL:-dummy:smollm2-135m}" \
      --workers 4 --routers "$r" --worker-args="--gpu-memory-share=0.2 --kv-cache-tokens 32000" \
      --backend grpc --workload "${HIT_WORKLOADS:-shared-prefix,multi-turn}" --groups 24 \
      --num-requests "${HIT_REQUESTS:-384}" \
      --prefix-len "${HIT_PREFIX:-4096}" --question-len 64 --output-len 64 --turns 4 --think-time 0.5 \
      --concurrency 64 --connections 4 --client-procs 4 --out-dir "$OUT" \
      --name "router-tier-hits${HIT_TAG:-}-r$r-$MACHINE" > "$OUT/router-tier-hits${HIT_TAG:-}-r$r.log" 2>&1
    echo "hits r$r rc=$?"; grep -A3 "^workload" "$OUT/router-tier-hits${HIT_TAG:-}-r$r.log" | tail -3
    el "hits r$r"
  done
fi
if part big; then
  if [ -n "$BASELINE" ]; then
    cluster big-base "$BASELINE" --model dummy:llama-3-8b --workers 1
    drive big-base $BIG_LOAD --backend grpc-unary-direct,grpc-unary,grpc-direct,grpc
    stop_cluster
  fi
  cluster big "$PWD" --model dummy:llama-3-8b --workers 1
  drive big $BIG_LOAD --backend grpc-unary-direct,grpc-unary,grpc-direct,grpc
  stop_cluster
fi
