# Sourced by the GPU run scripts (bench/*_gpu.sh) from the repository root: installs the
# wheels the GPU machine lacks (.whl/, docs/performance.md "Running the GPU benchmarks")
# into $SITE and defines `el` (elapsed-time lines), `part NAME` (whether $PARTS names it)
# and `run LABEL TIMEOUT ARGS...` (python3 ARGS with its log in $OUT/LABEL.log, the log's
# tail and the elapsed time printed). The caller sets PARTS first; OUT defaults here.
OUT=${OUT:-bench/results}; mkdir -p "$OUT"
source bench/gpu_machine.sh  # MACHINE
SITE=${SITE:-/tmp/site}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
S=$(date +%s); el() { echo "[t=$(( $(date +%s) - S ))s] $*"; }
if ! ls .whl/*.whl > /dev/null 2>&1; then
  echo "no wheels in .whl/: run 'bash bench/gpu_wheels.sh' where the registries answer," \
    "then carry .whl with the call" >&2
  exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || exit 1
export PYTHONPATH=$PWD:$SITE
part() { [[ " $PARTS " == *" $1 "* ]]; }
run() {  # run LABEL TIMEOUT ARGS...
  local label=$1 limit=$2; shift 2
  PYTHONSAFEPATH=1 timeout "$limit" python3 "$@" > "$OUT/$label.log" 2>&1
  echo "$label rc=$?"; tail -n 30 "$OUT/$label.log"; el "$label"
}
