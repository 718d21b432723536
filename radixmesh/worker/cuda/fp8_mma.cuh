// Device helpers shared by the project's CUDA C++ kernels that multiply e4m3 rows on the
// 16-bit matrix unit (attention/kernels/cuda/decode_fp8.cu, layers/kernels/cuda/fp8_gemv.cu):
// e4m3 pairs to fp16 pairs, mma.sync m16n8k16 (fp16 and bf16 operands), 16-byte loads,
// powers of two, and the power-of-two shift that brings a 16-bit vector into fp16's range. worker/cuda_library.py
// compiles every kernel with this folder on the include path and names each library by a
// hash that covers this file too.

#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace radixmesh {

constexpr unsigned kAll = 0xffffffffu;

__device__ __forceinline__ float pow2(int e) {  // e in [-126, 127]: 2^e exactly
  return __int_as_float((e + 127) << 23);
}

// The exponent e of the power of two 2^-e that brings a vector whose largest |value| is
// `amax` to at most 2^14, fp16's range with room for sums (ceil(log2(amax / 2^14)),
// clamped; 0 for a zero vector).
__device__ __forceinline__ int fp16_shift_exponent(float amax) {
  if (!(amax > 0.f)) return 0;
  int e;
  const float mant = frexpf(amax * (1.f / 16384.f), &e);
  return min(max(mant == 0.5f ? e - 1 : e, -126), 126);
}

// The low or high two bytes of `w` (e4m3) as an fp16 pair, low byte in the low half: the
// halves are named as such so that the conversion reads the high one in place.
__device__ __forceinline__ uint32_t e4m3x2_lo(uint32_t w) {
  uint32_t d;
  asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l;}" : "=r"(d) : "r"(w));
  return d;
}

__device__ __forceinline__ uint32_t e4m3x2_hi(uint32_t w) {
  uint32_t d;
  asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, h;}" : "=r"(d) : "r"(w));
  return d;
}

// d += A B, m16n8k16, fp16 operands, float32 accumulators.
__device__ __forceinline__ void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += A B, m16n8k16, bf16 operands, float32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 load16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

}  // namespace radixmesh
