#!/usr/bin/env bash
# The host-memory KV tier's GPU runs, from the repository root on one GPU:
#   PARTS="tests bench" bash bench/host_kv_gpu.sh
#   tests  the tier's tests (its CUDA copy kernel over pinned memory among them)
#   bench    bench.host_kv: the copy kernel's bandwidth, a reload's cost to a decoding
#            batch, then multi-turn chat on dummy:llama-3-8b with a shrunk device pool,
#            with and without the tier
#   routing  two workers on the GPU (32,000-token pools, 96k-token host tiers) through
#            the router, tier-aware (host_hit_cost 0.2) then tier-blind (1.0) on the same
#            workers: shared-prefix (48 prefixes of 2,048 tokens, 8 requests each) and
#            multi-turn (96 conversations of a 2,048-token system prompt and 4 turns of
#            64 + 64 tokens, 0.5 s think time): more than both pools hold, less than
#            pools and host tiers
# The project's missing packages travel as wheels in .whl/ (docs/performance.md,
# "Running the GPU benchmarks").
set -u
PARTS=${PARTS:-"tests bench"}
source bench/gpu_env.sh
el "installed"
if part tests; then
  run host-tests 300 -m pytest -q -p no:cacheprovider tests/worker/kvcache/test_host_tier.py \
    tests/worker/kvcache/test_tier_properties.py
fi
if part routing; then
  PYTHONSAFEPATH=1 timeout 420 python3 -m bench.serve --launch --model dummy:llama-3-8b --workers 2 \
    --worker-args="--gpu-memory-share=0.45 --kv-cache-tokens 32000 --host-kv-cache-bytes 12884901888" \
    --policies "cache_aware,cache_aware:host_hit_cost=1.0" --backend grpc \
    --workload shared-prefix,multi-turn --groups 48 --prefix-len 2048 --question-len 64 --output-len 64 \
    --turns 4 --think-time 0.5 --num-requests ${ROUTING_REQUESTS:-384} \
    --concurrency 64 --connections 4 --client-procs 4 --out-dir "$OUT" \
    --name "host-tier-routing-$MACHINE" > "$OUT/host-tier-routing.log" 2>&1
  echo "routing rc=$?"; grep -A6 "^workload" "$OUT/host-tier-routing.log" | tail -6; el routing
fi
if part bench; then
  run host_kv-copy 120 -m bench.host_kv --parts copy --out "$OUT/host_kv-copy-$MACHINE.json"
  run host_kv 480 -m bench.host_kv --model dummy:llama-3-8b --device cuda --parts stall,chat \
    ${BENCH_ARGS:-} --out "$OUT/host_kv-$MACHINE.json"
fi
