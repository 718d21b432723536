#!/usr/bin/env bash
# Fills .whl/ with the Python packages the GPU machines lack, as CPython 3.12 x86-64 wheels
# at the versions this checkout's .venv holds (so the GPU runs import what the tests here
# ran against), from the repository root on a machine with registry access, after `make
# setup`: `bash bench/gpu_wheels.sh`. The GPU run scripts (bench/*_gpu.sh, through
# bench/gpu_env.sh) install them there with `pip install --no-index --no-deps --target`;
# a call carries them with `carry: [".whl"]` (~19 MB of the 64 MiB a call may carry).
# FlashInfer travels apart (bench/flashinfer_bundle.sh, which adds apache-tvm-ffi here).
#
# The set: what the worker imports beyond the GPU machines' image (docs/performance.md,
# "Running the GPU benchmarks"), with the dependencies the image lacks too; grpcio and
# protobuf because the image's are older than the generated stubs need.
set -euo pipefail
PY=${PY:-.venv/bin/python}
PACKAGES=(xgrammar apache-tvm-ffi outlines_core gguf msgpack Pebble greenlet
  pydantic pydantic_core annotated-types typing-inspection
  jsonschema jsonschema-specifications referencing rpds-py
  grpcio grpcio-health-checking grpcio-reflection protobuf)
PLATFORMS=(--platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p .whl
pins=$("$PY" - "${PACKAGES[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

missing = []
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f"not installed in this environment (run `make setup`): {', '.join(missing)}")
EOF
)
# One version of each: two wheels of a package stop the whole install there.
for pin in $pins; do
  name=${pin%%==*}
  norm=$(echo "$name" | tr 'A-Z.-' 'a-z__')
  for old in .whl/*.whl; do  # {distribution}-{version}-...: another version goes
    [ -e "$old" ] || continue
    base=$(basename "$old")
    dist=$(echo "${base%%-*}" | tr 'A-Z.-' 'a-z__')
    rest=${base#*-}
    if [ "$dist" = "$norm" ] && [ "${rest%%-*}" != "${pin#*==}" ]; then rm -f "$old"; fi
  done
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d .whl "$pin"
done
ls .whl
du -sh .whl
