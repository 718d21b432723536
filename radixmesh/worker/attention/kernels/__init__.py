"""Triton kernels over the paged KV pool, each with a pure-PyTorch reference beside it.

- `kv_store`: write new tokens' K/V into their slots.
- `extend_attention`: ragged new tokens over their cached prefix plus themselves (causal).
- `decode_attention`: one new token per sequence, split along the sequence
  (flash-decoding, `decode_split`), reading each KV head once for its whole query group;
  `decode_fp8_mma`: its first stage over an FP8 pool on the FP8 matrix unit (an option);
  `decode_fp8_cuda`: that stage in CUDA C++ (cuda/decode_fp8.cu, built by nvcc), the
  default over an FP8 pool where it applies.

Importing these modules imports triton; on a machine without a GPU set
`TRITON_INTERPRET=1` before the first import to run them in triton's interpreter.
"""
