# Sourced by the GPU run scripts (bench/*_gpu.sh, via gpu_env.sh or directly): MACHINE, the
# result files' machine suffix (h100, h200, ...) from the GPU's name unless given; "gpu"
# when the name carries no model number.
MACHINE=${MACHINE:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
  | grep -oiE 'h[0-9]{3}' | tr 'A-Z' 'a-z')}
MACHINE=${MACHINE:-gpu}
