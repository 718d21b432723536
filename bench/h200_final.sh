#!/usr/bin/env bash
# The closing H200 runs of 2026-11-30 (third session), in two device calls:
#   PARTS=offline  on nvidia-h200:    bench/offline.py with transformers side by side,
#                                      throughput workload x3 on cache-on and cache-off engines
#   PARTS="json tp tp70 launch" on nvidia-h200-x2: JSON decoding (batch 64 x2, batch 32),
#                                      tp 1 vs 2 (sync), tp 2 on full-depth dummy:llama-3-70b,
#                                      `radixmesh launch --tp-size 2`
# Carry .whl (see bench/h200_session.sh). Results and logs go to $OUT.
set -u
PARTS=${PARTS:-"json tp"}
source bench/device_env.sh

if part tests; then
  timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/worker > "$OUT/gpu-tests.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/gpu-tests.log"; el tests
fi
if part offline; then
  timeout -s INT 560 python bench/offline.py --model dummy:llama-3-8b --device cuda --workloads gpu \
    --kv-cache-bytes 0 --max-running-requests 256 --max-num-batched-tokens 8192 --repeats 3 \
    --out "$OUT/offline-gpu-$D-final.json" > "$OUT/offline.log" 2>&1
  echo "offline rc=$?"; tail -14 "$OUT/offline.log"; el offline
fi
if part json; then
  timeout 150 python bench/json_decode.py --model dummy:llama-3-8b --documents 256 \
    --max-running-requests 64 --max-new-tokens 400 --kv-cache-bytes 16000000000 --repeats 2 \
    --out "$OUT/json_decode-gpu-$D-b64.json" > "$OUT/json64.log" 2>&1
  echo "json64 rc=$?"; grep -E "jump_forward=|ratio|ms per|mask|real step" "$OUT/json64.log"; el json64
  timeout 100 python bench/json_decode.py --model dummy:llama-3-8b --documents 256 \
    --max-running-requests 32 --mask-batch 32 --max-new-tokens 400 --kv-cache-bytes 16000000000 \
    --skip-mask --out "$OUT/json_decode-gpu-$D-b32.json" > "$OUT/json32.log" 2>&1
  echo "json32 rc=$?"; grep -E "jump_forward=|ratio|ms per" "$OUT/json32.log"; el json32
fi
if part tp; then
  timeout 150 python bench/tp.py --tp 1,2 --out "$OUT/tp-gpu-$D-final.json" > "$OUT/tp.log" 2>&1
  echo "tp rc=$?"; grep -A3 "^run " "$OUT/tp.log"; el tp
fi
if part tp70; then
  timeout 170 python bench/tp.py --model dummy:llama-3-70b --tp 2 --requests 64 --groups 4 \
    --decode-tokens 64 --profile-steps 0 --allreduce-batches 1 \
    --out "$OUT/tp-70b-gpu-$D.json" > "$OUT/tp70.log" 2>&1
  echo "tp70 rc=$?"; grep -A2 "^run " "$OUT/tp70.log"; tail -3 "$OUT/tp70.log"; el tp70
fi
# `radixmesh launch --tp-size 2` serving through the router: h200_session.sh's part.
part launch && PARTS=launch bash bench/h200_session.sh
true
