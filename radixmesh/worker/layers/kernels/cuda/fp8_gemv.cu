// FP8 (e4m3) weights times a few rows of activations (1-16): the decode-time GEMM, in
// CUDA C++ (fp8_gemv_cuda.py builds and loads it; fp8_small_m.py is the Triton kernel it
// is measured against).
//
// At decode the GEMM is bound by reading the weights. A block owns 16 weight rows (output
// channels) over all of K, its warps splitting K between them: each thread reads exactly
// the bytes it multiplies with 16-byte loads straight into registers (four 128-column
// chunks, 8 KB a warp, in flight at once), turns e4m3 into the activations' 16-bit type
// in registers, and `mma.sync` m16n8k16 multiplies them (float32 accumulators) with the
// activations as the B operand: y^T = W x^T, the weight rows filling the matrix unit's 16
// rows and the activation rows its 8 columns (two n-tiles for 9-16 rows). The warps'
// sums meet in shared memory and the first warp adds them in warp order (fixed: the bits
// do not depend on which warp ends first), scales, biases and rounds them.
//
// One launch, reading the activations as they are: an earlier version shifted each
// activation row into fp16's range in a launch of its own (one block a row, whose
// serial walk over K cost 2-20 us, more than o's whole product) and split K across
// blocks, whose float32 partial sums a third launch added.
//
// Numerics: e4m3 values are exact in fp16 and bf16, and a 16-bit product is exact in
// float32, so the result is the dequantized weights' product with the activations up to
// float32 summation order, as the Triton kernel's. fp16 activations take the weights as
// fp16 (one `cvt` a pair); bf16 activations take them as bf16 (fp16 -> float32 ->
// bf16, exact), and the bf16 matrix unit.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8_mma.cuh"  // worker/cuda/: e4m3 pairs, mma, 16-byte loads

// The parameter block (fp8_gemv_cuda.py's `_GemvParams`, field for field).
struct GemvParams {
  const uint16_t* x;     // [m, k] bf16 or fp16 bits, row stride stride_x
  const uint8_t* w;      // [n, k] e4m3, row stride stride_w
  const float* scale;    // [n]: per output channel
  const uint16_t* bias;  // [n] in x's dtype, or null
  uint16_t* y;           // [m, n] in x's dtype, row stride stride_y
  int32_t m, n, k;
  int32_t x_bf16;
  int64_t stride_x, stride_w, stride_y;
};

namespace {

using namespace radixmesh;

constexpr int kChunk = 128;  // K columns a warp's k-steps cover at once (4 threads x 32)
constexpr int kAhead = 4;    // chunks whose weights a warp has in flight at once

__device__ __forceinline__ float to_float(uint16_t bits, bool bf16) {
  return bf16 ? __uint_as_float((uint32_t)bits << 16)
              : __half2float(__ushort_as_half((unsigned short)bits));
}

__device__ __forceinline__ uint16_t from_float(float v, bool bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v))
              : __half_as_ushort(__float2half_rn(v));
}

// An fp16 pair as a bf16 pair (exact for e4m3 values: 3 mantissa bits, exponents well
// inside both ranges).
__device__ __forceinline__ uint32_t f16x2_to_bf16x2(uint32_t h) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __float22bfloat162_rn(f);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// The low or high two bytes of `w` (e4m3) as a pair of the activations' type.
template <bool BF16>
__device__ __forceinline__ uint32_t pair_lo(uint32_t w) {
  return BF16 ? f16x2_to_bf16x2(e4m3x2_lo(w)) : e4m3x2_lo(w);
}

template <bool BF16>
__device__ __forceinline__ uint32_t pair_hi(uint32_t w) {
  return BF16 ? f16x2_to_bf16x2(e4m3x2_hi(w)) : e4m3x2_hi(w);
}

// d += A B, m16n8k16, bf16 operands, float32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <bool BF16>
__device__ __forceinline__ void mma16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                      uint32_t a3, uint32_t b0, uint32_t b1) {
  if (BF16) {
    mma_bf16(d, a0, a1, a2, a3, b0, b1);
  } else {
    mma(d, a0, a1, a2, a3, b0, b1);
  }
}

// The activation rows' B fragments of one 128-column chunk: row `r` (zero past m), k-step
// s's columns 32t + 4s + {0, 1} (word 2s) and {2, 3} (word 2s + 1): the columns whose
// weights the thread holds (any order of K gives the same sums, the A and B fragments
// only have to agree).
struct RowFrags {
  uint4 v[4];
};

__device__ __forceinline__ void load_rows(const GemvParams& p, int r, int c, int t,
                                          RowFrags& f) {
  if (r < p.m) {
    const uint16_t* src = p.x + (int64_t)r * p.stride_x + c + 32 * t;
#pragma unroll
    for (int i = 0; i < 4; ++i) f.v[i] = load16(src + 8 * i);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) f.v[i] = make_uint4(0u, 0u, 0u, 0u);
  }
}

__device__ __forceinline__ uint32_t word(const uint4 (&v)[4], int i) {
  return (&v[i >> 2].x)[i & 3];
}

// Block blockIdx.x: weight rows [16 b, 16 b + 16) over all of K, warp w taking chunks
// [w C / WARPS, (w + 1) C / WARPS) of the C = k / 128. TWO_TILES: activation rows 8-15 as
// a second n-tile (m > 8).
template <int WARPS, bool BF16, bool TWO_TILES>
__global__ void __launch_bounds__(WARPS * 32) gemv(const GemvParams p) {
  constexpr int kAcc = TWO_TILES ? 8 : 4;
  __shared__ float sums[WARPS > 1 ? WARPS - 1 : 1][kAcc][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16;
  const int chunks = p.k / kChunk;
  const int kb = warp * chunks / WARPS * kChunk;
  const int ke = (warp + 1) * chunks / WARPS * kChunk;
  // Thread (g, t): rows g and 8 + g of the slab, columns [c + 32t, c + 32t + 32) of a chunk.
  const uint8_t* w0 = p.w + (int64_t)(n0 + g) * p.stride_w + 32 * t;
  const uint8_t* w1 = w0 + 8 * p.stride_w;
  // acc[0..3]: (row g, x rows 2t, 2t + 1), (row 8 + g, same); acc[4..7]: x rows 8 + 2t,
  // 9 + 2t.
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  float(&lo)[4] = *reinterpret_cast<float(*)[4]>(&acc[0]);
  float(&hi)[4] = *reinterpret_cast<float(*)[4]>(&acc[kAcc - 4]);
  for (int c0 = kb; c0 < ke; c0 += kAhead * kChunk) {
    uint4 wr[kAhead][2][2];  // chunk, row (g, 8 + g), 16-byte half
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int c = c0 + u * kChunk;
      if (c < ke) {
        wr[u][0][0] = load16(w0 + c);
        wr[u][0][1] = load16(w0 + c + 16);
        wr[u][1][0] = load16(w1 + c);
        wr[u][1][1] = load16(w1 + c + 16);
      }
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int c = c0 + u * kChunk;
      if (c >= ke) break;
      RowFrags xa, xb;
      load_rows(p, g, c, t, xa);
      if (TWO_TILES) load_rows(p, 8 + g, c, t, xb);
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const uint32_t r0 = (&wr[u][0][s >> 2].x)[s & 3];  // row g's word s
        const uint32_t r1 = (&wr[u][1][s >> 2].x)[s & 3];  // row 8 + g's
        const uint32_t a0 = pair_lo<BF16>(r0), a1 = pair_lo<BF16>(r1);
        const uint32_t a2 = pair_hi<BF16>(r0), a3 = pair_hi<BF16>(r1);
        mma16<BF16>(lo, a0, a1, a2, a3, word(xa.v, 2 * s), word(xa.v, 2 * s + 1));
        if (TWO_TILES) {
          mma16<BF16>(hi, a0, a1, a2, a3, word(xb.v, 2 * s), word(xb.v, 2 * s + 1));
        }
      }
    }
  }
  if (WARPS > 1) {
    if (warp > 0) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) sums[warp - 1][i][lane] = acc[i];
    }
    __syncthreads();
    if (warp > 0) return;
    for (int w = 0; w < WARPS - 1; ++w) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] += sums[w][i][lane];
    }
  }
  // acc[i] (i < 4): weight row n0 + g + 8 (i >> 1), x row 2t + (i & 1); acc[4 + i]: x
  // row 8 + 2t + (i & 1).
  const bool bf16 = BF16;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int m = 8 * (i >> 2) + 2 * t + (i & 1);
    const int n = n0 + g + 8 * ((i >> 1) & 1);
    if (m >= p.m) continue;
    float v = acc[i] * p.scale[n];
    if (p.bias != nullptr) v += to_float(p.bias[n], bf16);
    p.y[m * p.stride_y + n] = from_float(v, bf16);
  }
}

template <int WARPS, bool BF16>
cudaError_t launch(const GemvParams& p, cudaStream_t stream) {
  const int blocks = p.n / 16;
  if (p.m > 8) {
    gemv<WARPS, BF16, true><<<blocks, WARPS * 32, 0, stream>>>(p);
  } else {
    gemv<WARPS, BF16, false><<<blocks, WARPS * 32, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <int WARPS>
cudaError_t launch(const GemvParams& p, cudaStream_t stream) {
  return p.x_bf16 ? launch<WARPS, true>(p, stream) : launch<WARPS, false>(p, stream);
}

}  // namespace

// The C entry point (ctypes, fp8_gemv_cuda.py): `warps` per block (1, 2, 4, 8 or 16; at
// most k / 128). Returns a cudaError_t; cudaErrorInvalidValue for shapes it does not take (m
// in [1, 16], n a multiple of 16, k a multiple of 128; x's and w's rows 16-byte aligned,
// which the caller checks).
extern "C" int radixmesh_fp8_gemv(const GemvParams* p, int warps, int64_t stream) {
  if (p->m < 1 || p->m > 16 || p->n % 16 || p->k % kChunk || warps * kChunk > p->k) {
    return cudaErrorInvalidValue;
  }
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (warps == 1) return launch<1>(*p, s);
  if (warps == 2) return launch<2>(*p, s);
  if (warps == 4) return launch<4>(*p, s);
  if (warps == 8) return launch<8>(*p, s);
  if (warps == 16) return launch<16>(*p, s);
  return cudaErrorInvalidValue;
}

extern "C" int radixmesh_fp8_gemv_params_size() { return (int)sizeof(GemvParams); }
