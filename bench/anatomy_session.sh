# Device call: all-reduce microbench, JSON decode ratio, batch-1 anatomy (tp 1, 2).
set -u
PARTS=${PARTS:-"ar json b1"}
source bench/device_env.sh
part ar && { timeout 90 python bench/allreduce.py --world 2 --out $OUT/allreduce.json > $OUT/allreduce.log 2>&1; echo ar rc=$?; el ar; }
part json && { timeout 150 python bench/json_decode.py --model dummy:llama-3-8b --documents 256 \
  --max-running-requests 64 --max-new-tokens 400 --kv-cache-bytes 16000000000 \
  --out $OUT/json_decode.json > $OUT/json.log 2>&1; echo json rc=$?; grep -E "jump_forward=|ratio|ms per|mask" $OUT/json.log; el json; }
part b1 && for tp in 1 2; do timeout 100 python bench/step_anatomy.py --workload batch1 --tp $tp --overlap-schedule \
  --out $OUT/anat-b1-tp$tp.json > $OUT/anat-b1-tp$tp.log 2>&1; echo b1 tp$tp rc=$?; el b1 $tp; done
part janat && { timeout 150 python bench/step_anatomy.py --workload json --cuda-graph-max-batch-size 512 --out $OUT/anat-json.json > /dev/null 2>&1; el janat; }

part tests && { timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/worker > $OUT/gpu-tests.log 2>&1; echo tests rc=$?; tail -4 $OUT/gpu-tests.log; el tests; }
part tp && { timeout 150 python bench/tp.py --tp 1,2 --overlap-schedule --out $OUT/tp-overlap.json > $OUT/tp.log 2>&1; echo tp rc=$?; grep -A8 "^run " $OUT/tp.log | head -12; el tp; }
part jprof && { timeout 150 python bench/json_decode.py --model dummy:llama-3-8b --documents 256 \
  --max-running-requests 64 --max-new-tokens 400 --kv-cache-bytes 16000000000 --skip-mask \
  --profile $OUT/jprof --out $OUT/json_prof.json > /dev/null 2>&1; echo jprof rc=$?; el jprof; }

true
