#!/usr/bin/env bash
# The H200 session's runs, in priority order, each under its own time limit; results and
# logs go to $OUT (the device tool brings back at most 8 files). Run on the two-GPU
# machine (nvidia-h200-x2) from the repository root, with .whl/grammar (xgrammar,
# jsonschema, gguf, grpc health/reflection wheels for Python 3.12) and .whl/grpc (grpcio
# and protobuf as in the venv: the machine's grpcio 1.84 is older than the 1.85.1 our
# generated stubs and grpc_health require) carried; see ENV.md.
set -u
PARTS=${PARTS:-"tests tp offline json launch"}
source bench/device_env.sh

# 1. GPU tests (TP over NCCL, overlap, jump-forward decode rows, graphs, pool sizing).
part tests && timeout 100 python -m pytest -q -m gpu --continue-on-collection-errors -p no:cacheprovider \
  tests/worker > "$OUT/gpu-tests.log" 2>&1; echo "tests rc=$?"; tail -4 "$OUT/gpu-tests.log"; el tests

# 2. Tensor parallelism with the overlap scheduler: tp 1 vs tp 2.
part tp && timeout 120 python bench/tp.py --tp 1,2 --overlap-schedule --out "$OUT/tp-overlap-gpu-$D.json" \
  > "$OUT/tp.log" 2>&1; echo "tp rc=$?"; grep -A8 "^run " "$OUT/tp.log"; el tp

# 3. Offline workloads, overlap on and off in the same session.
part offline && for mode in overlap sync; do
  flag=""; [ "$mode" = overlap ] && flag="--overlap-schedule"
  timeout 110 python bench/offline.py --model dummy:llama-3-8b --device cuda --workloads gpu \
    --kv-cache-bytes 0 --max-running-requests 256 --max-num-batched-tokens 8192 --skip-baseline \
    $flag --out "$OUT/offline-gpu-$mode-$D.json" 2>&1 | grep -E "^(throughput|shared_prefix)"
  el "offline $mode"
done

# 4. JSON decoding, jump-forward on vs off (forced tokens as graphed decode rows).
part json && timeout 100 python bench/json_decode.py --model dummy:llama-3-8b --documents 256 \
  --max-running-requests 64 --max-new-tokens 400 --kv-cache-bytes 16000000000 \
  --out "$OUT/json_decode-gpu-$D.json" 2>&1 | grep -E "jump_forward=|ratio|mask|graph"; el json

# 5. `radixmesh launch --tp-size 2` (its worker runs `radixmesh worker --tp-size 2`) serving
#    a request through the router, then Ctrl-C.
if part launch; then
python -m radixmesh.cluster.cli launch --model dummy:llama-3-8b --workers 1 --tp-size 2 \
  --port 50050 > "$OUT/launch-tp2.log" 2>&1 &
L=$!
timeout 120 python - <<'PY'
import time
from radixmesh.client import Client
deadline = time.time() + 110
while True:
    try:
        with Client("127.0.0.1:50050", timeout=30) as c:
            out = c.generate(input_ids=list(range(1, 65)),
                             sampling_params={"temperature": 0, "max_new_tokens": 8})
            print("launch --tp-size 2 answered:", out.token_ids, out.finish_reason)
            break
    except Exception as e:  # not ready yet
        if time.time() > deadline:
            print("launch --tp-size 2 did not answer:", type(e).__name__, e)
            break
        time.sleep(2)
PY
kill -INT $L; wait $L; echo "launch rc=$?"; grep -v "^\s*$" "$OUT/launch-tp2.log" | tail -6; el launch
fi
