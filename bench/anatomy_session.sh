set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pip install --no-index --no-deps --target /tmp/site .whl/grammar/*.whl .whl/grpc/*.whl -q 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
S=$(date +%s); el() { echo "[t=$(( $(date +%s) - S ))s] $*"; }
python -c "import torch, torch.distributed._symmetric_memory as s; print('symm', [n for n in dir(torch.ops.symm_mem) if 'reduce' in n][:20])" 2>&1 | tail -1
for tp in 1 2; do
 timeout 100 python bench/step_anatomy.py --workload batch1 --tp $tp --overlap-schedule --out $OUT/anat-b1-tp$tp.json > $OUT/anat-b1-tp$tp.log 2>&1; echo rc=$?; el b1 tp$tp
done
timeout 60 python bench/step_anatomy.py --workload batch1 --tp 1 --out $OUT/anat-b1-tp1-sync.json > /dev/null 2>&1; el b1 sync
timeout 150 python bench/step_anatomy.py --workload json --documents 256 --out $OUT/anat-json.json > $OUT/anat-json.log 2>&1; echo rc=$?; el json
tail -5 $OUT/anat-json.log
