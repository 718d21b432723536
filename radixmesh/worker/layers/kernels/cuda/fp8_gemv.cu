// FP8 (e4m3) weights times a few rows of activations (1-16): the decode-time GEMM, in
// CUDA C++ (fp8_gemv_cuda.py builds and loads it; fp8_small_m.py is the Triton kernel it
// is measured against).
//
// At decode the GEMM is bound by reading the weights: the Triton kernel reads them at
// 1.5-2.8 TB/s on the H200 against bf16 cuBLAS's ~3.4 (docs/quantization.md). This one is
// laid out as the FP8 KV decode kernel (attention/kernels/cuda/decode_fp8.cu), whose score
// product is the same problem (e4m3 rows times a few 16-bit vectors): each warp owns 16
// weight rows (output channels) over a slice of K, a thread reads exactly the bytes it
// multiplies with 16-byte loads straight into registers (no shared memory, no barrier),
// several 128-column chunks in flight at once, e4m3 pairs become fp16 pairs with one `cvt`
// each, and `mma.sync` m16n8k16 multiplies them (float32 accumulators) with the
// activations as the B operand: y^T = W x^T, the weight rows filling the matrix unit's 16
// rows and the activation rows its 8 columns (two n-tiles for 9-16 rows).
//
// Numerics: the activations go to fp16 after a power-of-two shift per row that brings the
// row's max |x| to at most 2^14 (bf16's 8-bit mantissas fit fp16's 11; only values below
// 2^-38 of the row's max lose bits), undone with the weight scale on the float32 sums;
// e4m3 weights are exact in fp16. So the result is the dequantized weights' product with
// the activations up to float32 summation order, as the Triton kernel's.
//
// Three launches on the caller's stream (so a CUDA graph records them): the activations'
// shift and conversion (one block a row), the products (one warp per 16 rows and K slice),
// and, with K split, the slices' partial sums added in a fixed order (no atomics, so the
// bits do not depend on which slice ends first), scaled, biased and rounded.

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8_mma.cuh"  // worker/cuda/: e4m3 pairs, mma, 16-byte loads, powers of two

// The parameter block (fp8_gemv_cuda.py's `_GemvParams`, field for field).
struct GemvParams {
  const uint16_t* x;     // [m, k] bf16 or fp16 bits, row stride stride_x
  const uint8_t* w;      // [n, k] e4m3, row stride stride_w
  const float* scale;    // [n]: per output channel
  const uint16_t* bias;  // [n] in x's dtype, or null
  uint16_t* y;           // [m, n] in x's dtype, row stride stride_y
  uint16_t* x16;         // workspace [16, k] fp16: the rows shifted into fp16's range
  float* x_scale;        // workspace [16]: each row's shift back (a power of two)
  float* partial;        // workspace [splits, 16, n] float32 (read when splits > 1)
  int32_t m, n, k;
  int32_t x_bf16;
  int32_t splits;   // K slices
  int32_t k_slice;  // K columns per slice: a multiple of 128
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

// Row blockIdx.x of x: its shift into fp16's range (max |x| to at most 2^14) and the
// shifted row as fp16.
__global__ void __launch_bounds__(256) prepare_rows(const GemvParams p) {
  __shared__ float s_max[8];
  const int row = blockIdx.x;
  const bool bf16 = p.x_bf16 != 0;
  const uint16_t* x = p.x + row * p.stride_x;
  float amax = 0.f;
  for (int i = threadIdx.x; i < p.k; i += blockDim.x) amax = fmaxf(amax, fabsf(to_float(x[i], bf16)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kAll, amax, o));
  if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.f;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) amax = fmaxf(amax, s_max[w]);
  const int e = fp16_shift_exponent(amax);
  const float shift = pow2(-e);
  uint16_t* out = p.x16 + (int64_t)row * p.k;
  for (int i = threadIdx.x; i < p.k; i += blockDim.x) {
    out[i] = __half_as_ushort(__float2half_rn(to_float(x[i], bf16) * shift));
  }
  if (threadIdx.x == 0) p.x_scale[row] = pow2(e);
}

// The activation rows' B fragments of one 128-column chunk: row `r` (zero past m), k-step
// s's columns 32t + 4s + {0, 1} (word 2s) and {2, 3} (word 2s + 1).
struct RowFrags {
  uint4 v[4];
};

__device__ __forceinline__ void load_rows(const GemvParams& p, int r, int c, int t,
                                          RowFrags& f) {
  if (r < p.m) {
    const uint16_t* src = p.x16 + (int64_t)r * p.k + c + 32 * t;
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

// One warp: weight rows [n0, n0 + 16) over K columns [kb, ke) of slice blockIdx.y.
// TWO_TILES: activation rows 8-15 as a second n-tile (m > 8).
template <int WARPS, bool TWO_TILES>
__global__ void __launch_bounds__(WARPS * 32) gemv_slices(const GemvParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = (blockIdx.x * WARPS + warp) * 16;
  if (n0 >= p.n) return;
  const int kb = blockIdx.y * p.k_slice;
  const int ke = min(kb + p.k_slice, p.k);
  // Thread (g, t): rows g and 8 + g of the slab, columns [c + 32t, c + 32t + 32) of a chunk.
  const uint8_t* w0 = p.w + (int64_t)(n0 + g) * p.stride_w + 32 * t;
  const uint8_t* w1 = w0 + 8 * p.stride_w;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};   // (row g, x rows 2t, 2t + 1), (row 8 + g, same)
  float acc2[4] = {0.f, 0.f, 0.f, 0.f};  // the same for x rows 8 + 2t, 9 + 2t
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
        const uint32_t a0 = e4m3x2_lo(r0), a1 = e4m3x2_lo(r1);
        const uint32_t a2 = e4m3x2_hi(r0), a3 = e4m3x2_hi(r1);
        mma(acc, a0, a1, a2, a3, word(xa.v, 2 * s), word(xa.v, 2 * s + 1));
        if (TWO_TILES) mma(acc2, a0, a1, a2, a3, word(xb.v, 2 * s), word(xb.v, 2 * s + 1));
      }
    }
  }
  // c0: (weight row n0 + g, x row 2t), c1: (n0 + g, 2t + 1), c2: (n0 + 8 + g, 2t),
  // c3: (n0 + 8 + g, 2t + 1); acc2 the same for x rows 8 + 2t, 9 + 2t.
  const bool bf16 = p.x_bf16 != 0;
#pragma unroll
  for (int tile = 0; tile < (TWO_TILES ? 2 : 1); ++tile) {
    const float* a = tile == 0 ? acc : acc2;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = 8 * tile + 2 * t + (i & 1);
      const int n = n0 + g + 8 * (i >> 1);
      if (m >= p.m) continue;
      if (p.splits > 1) {
        p.partial[((int64_t)blockIdx.y * 16 + m) * p.n + n] = a[i];
      } else {
        float v = a[i] * p.x_scale[m] * p.scale[n];
        if (p.bias != nullptr) v += to_float(p.bias[n], bf16);
        p.y[m * p.stride_y + n] = from_float(v, bf16);
      }
    }
  }
}

// The K slices' partial sums, added in slice order, scaled, biased and rounded.
__global__ void __launch_bounds__(256) add_slices(const GemvParams p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.m * p.n) return;
  const int m = i / p.n, n = i % p.n;
  float sum = 0.f;
  for (int s = 0; s < p.splits; ++s) sum += p.partial[((int64_t)s * 16 + m) * p.n + n];
  float v = sum * p.x_scale[m] * p.scale[n];
  const bool bf16 = p.x_bf16 != 0;
  if (p.bias != nullptr) v += to_float(p.bias[n], bf16);
  p.y[m * p.stride_y + n] = from_float(v, bf16);
}

template <int WARPS>
cudaError_t launch(const GemvParams& p, cudaStream_t stream) {
  prepare_rows<<<p.m, 256, 0, stream>>>(p);
  const dim3 grid((p.n / 16 + WARPS - 1) / WARPS, p.splits);
  if (p.m > 8) {
    gemv_slices<WARPS, true><<<grid, WARPS * 32, 0, stream>>>(p);
  } else {
    gemv_slices<WARPS, false><<<grid, WARPS * 32, 0, stream>>>(p);
  }
  if (p.splits > 1) add_slices<<<(p.m * p.n + 255) / 256, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

// The C entry point (ctypes, fp8_gemv_cuda.py): `warps` per block of the products' launch
// (2, 4 or 8). Returns a cudaError_t; cudaErrorInvalidValue for shapes it does not take
// (m in [1, 16], n a multiple of 16, k a multiple of 128, k_slice a multiple of 128).
extern "C" int radixmesh_fp8_gemv(const GemvParams* p, int warps, int64_t stream) {
  if (p->m < 1 || p->m > 16 || p->n % 16 || p->k % kChunk || p->k_slice % kChunk ||
      p->splits < 1 || p->splits > 64 || p->k_slice * p->splits < p->k) {
    return cudaErrorInvalidValue;
  }
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (warps == 2) return launch<2>(*p, s);
  if (warps == 4) return launch<4>(*p, s);
  if (warps == 8) return launch<8>(*p, s);
  return cudaErrorInvalidValue;
}

extern "C" int radixmesh_fp8_gemv_params_size() { return (int)sizeof(GemvParams); }
