# Sourced by the device-run scripts (bench/h200_session.sh, h200_final.sh, anatomy_session.sh)
# from the repository root: NVLink multicast off everywhere (KINDS.md), the carried wheels
# (.whl/grammar, .whl/grpc; see h200_session.sh) installed to /tmp/site, $OUT made, and
# `part NAME` (is NAME in $PARTS, whose default the script sets first) and `el MSG`
# (elapsed seconds) defined.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
pip install --no-index --no-deps --target /tmp/site .whl/grammar/*.whl .whl/grpc/*.whl -q 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
part() { [[ " $PARTS " == *" $1 "* ]]; }
D=$(date +%Y%m%d); S=$(date +%s)
el() { echo "[t=$(( $(date +%s) - S ))s] $*"; }
