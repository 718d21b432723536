#!/usr/bin/env bash
# Speculative decoding's GPU runs, from the repository root on one GPU:
#   PARTS="tests verify batch p1" bash bench/speculative_gpu.sh
#   tests   the GPU test (graphs + overlap against plain greedy)
#   verify  bench.speculative's verify part on dummy:llama-3-8b bf16: a verify step of
#           1 + k tokens at batch 1 against plain decode (k = 4, 8)
#   batch   64 requests (512-token prompts, 256 new tokens) with --speculative ngram
#           against off: speculation switched off above the batch limit
#   p1      the same at 256 x (512, 256) (the offline P1 shape)
#   draft   batch 1 with dummy:llama-3.2-1b drafting 4 tokens a step for dummy:llama-3-8b
#           (random weights: what a draft-model step costs) against plain decode
# The project's missing packages travel as wheels in .whl/ (docs/performance.md,
# "Running the GPU benchmarks").
set -u
PARTS=${PARTS:-"tests verify batch p1"}
source bench/gpu_env.sh
el "installed"
GPU="--model dummy:llama-3-8b --device cuda --dtype bfloat16"
if part tests; then
  run spec-tests 300 -m pytest -q -p no:cacheprovider tests/worker/test_speculative_gpu.py
fi
if part verify; then
  run spec-verify 300 -m bench.speculative $GPU --parts verify --verify-ks 4,8 \
    --verify-tokens 256 --repeats 3 --out "$OUT/speculative-verify-$MACHINE.json"
fi
if part batch; then
  run spec-batch 300 -m bench.speculative $GPU --parts batch --batch 64 \
    --out "$OUT/speculative-batch64-$MACHINE.json"
fi
if part draft; then
  run spec-draft 300 -m bench.speculative $GPU --parts draft --draft-model dummy:llama-3.2-1b \
    --k 4 --verify-tokens 128 --repeats 3 --out "$OUT/speculative-draft-$MACHINE.json"
fi
if part p1; then
  run spec-p1 300 -m bench.speculative $GPU --parts batch --batch 256 \
    --out "$OUT/speculative-p1-$MACHINE.json"
fi
