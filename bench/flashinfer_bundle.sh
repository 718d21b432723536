#!/usr/bin/env bash
# Builds what bench/flashinfer_gpu.sh carries to the GPU machine, from the repository root on
# a machine with registry access: `bash bench/flashinfer_bundle.sh` writes
#   .fi/flashinfer-<version>-slim.tar.xz   FlashInfer and its pure-Python dependencies,
#                                          installed for Python 3.12 / x86-64, less the
#                                          CUDA sources of kernels for other GPUs and
#                                          models (data/csrc/*/: 420 -> 180 MB unpacked,
#                                          62 -> 13 MB packed; the attention, norm, rope and
#                                          sampling sources at the top of data/csrc/
#                                          include only data/include, CUTLASS and CCCL)
#   .whl/apache_tvm_ffi-*.whl              its compiled dependency, with the project's wheels
# .fi/ and .whl/ are ignored by git (.gitignore). Compiled modules come back from a
# run as $OUT/flashinfer-aot.tar.xz; keep them in .fi/aot/ to skip the JIT next time.
set -euo pipefail
VERSION=${VERSION:-0.7.2.post1}
TVM_FFI=${TVM_FFI:-0.1.15.post2}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" -d "$work/wheels" \
  "flashinfer-python==$VERSION" ninja einops tabulate nvidia-ml-py
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" -d .whl "apache-tvm-ffi==$TVM_FFI"
python3 -m pip install -q --no-deps --no-compile --target "$work/site" "$work"/wheels/*.whl
rm -rf "$work/site/bin" "$work"/site/flashinfer/data/csrc/*/
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p .fi/aot
tar -cJf ".fi/flashinfer-$VERSION-slim.tar.xz" -C "$work/site" .
ls -la ".fi/flashinfer-$VERSION-slim.tar.xz"
