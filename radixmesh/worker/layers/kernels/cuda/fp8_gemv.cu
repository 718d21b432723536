// FP8 (e4m3) weights times a few rows of activations (1-16): the decode-time GEMM, in
// CUDA C++ (fp8_gemv_cuda.py builds and loads it; fp8_small_m.py is the Triton kernel it
// is measured against).
//
// At decode the GEMM is bound by reading the weights. A block owns 16 weight rows (output
// channels, a slab) at a time over all of K, its warps splitting K between them: each
// thread reads exactly the bytes it multiplies with 16-byte loads straight into registers,
// two 128-column chunks a stage, and issues the next stage's loads (the next slab's, at a
// slab's end) before it multiplies the current one; it turns e4m3 into the activations'
// 16-bit type in registers, and `mma.sync` m16n8k16 multiplies them (float32
// accumulators) with the activations as the B operand: y^T = W x^T, the weight rows
// filling the matrix unit's 16 rows and the activation rows its 8 columns (two n-tiles for
// 9-16 rows). The warps' sums meet in shared memory and the first warp adds them in warp
// order (fixed: the bits do not depend on which warp ends first), scales, biases and
// rounds them. With `persistent` the grid is what the SMs hold at once and each block
// walks several slabs, so no SM's loads wait for the next wave of blocks to start.
//
// One launch, reading the activations as they are: an earlier version shifted each
// activation row into fp16's range in a launch of its own (one block a row, whose
// serial walk over K cost 2-20 us, more than o's whole product) and split K across
// blocks, whose float32 partial sums a third launch added. The next (a block per slab,
// four chunks loaded at once, then multiplied) read cold weights at 2.7 TB/s in the
// engine: each warp's loads waited for its multiplies, and the launch's waves for each
// other.
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

// One stage of a warp's loads: kStage 128-column chunks of its two weight rows (g, 8 + g),
// two 16-byte halves each.
constexpr int kStage = 2;
struct Stage {
  uint4 w[kStage][2][2];
};

// A block's slabs (16 weight rows each) are blockIdx.x, + gridDim.x, ...; in each, warp w
// takes chunks [w C / WARPS, (w + 1) C / WARPS) of the C = k / 128, `groups` stages of
// kStage chunks (the same count in every warp, the last ones partly past its range). A
// warp's work is the sequence of (slab, stage) items, and it loads item i + 1 while it
// multiplies item i: its loads never wait for a block-wide step, and with a grid of at
// most the blocks the SMs hold at once (`persistent`), never for the next wave either.
template <int WARPS>
struct Walk {
  int kb, ke, groups, items;
  __device__ __forceinline__ Walk(const GemvParams& p, int warp) {
    const int chunks = p.k / kChunk;
    kb = warp * chunks / WARPS * kChunk;
    ke = (warp + 1) * chunks / WARPS * kChunk;
    const int most = (chunks + WARPS - 1) / WARPS;  // a warp's chunks, at most
    groups = (most + kStage - 1) / kStage;
    const int slabs = p.n / 16;
    items = (slabs - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x * groups;
  }
  __device__ __forceinline__ int slab(int i) const {
    return (int)blockIdx.x + i / groups * (int)gridDim.x;
  }
  __device__ __forceinline__ int col(int i) const {  // the item's first column
    return kb + i % groups * kStage * kChunk;
  }
  __device__ __forceinline__ bool last(int i) const { return i % groups == groups - 1; }
};

template <int WARPS>
__device__ __forceinline__ void load_stage(const GemvParams& p, const Walk<WARPS>& walk,
                                           int i, int g, int t, Stage& st) {
  const uint8_t* w0 = p.w + (int64_t)(walk.slab(i) * 16 + g) * p.stride_w + 32 * t;
  const uint8_t* w1 = w0 + 8 * p.stride_w;
  const int c0 = walk.col(i);
#pragma unroll
  for (int u = 0; u < kStage; ++u) {
    const int c = c0 + u * kChunk;
    if (c < walk.ke) {
      st.w[u][0][0] = load16(w0 + c);
      st.w[u][0][1] = load16(w0 + c + 16);
      st.w[u][1][0] = load16(w1 + c);
      st.w[u][1][1] = load16(w1 + c + 16);
    }
  }
}

// acc[0..3]: (weight row g, x rows 2t, 2t + 1), (row 8 + g, same); acc[4..7] (TWO_TILES):
// x rows 8 + 2t, 9 + 2t.
template <int WARPS, bool BF16, bool TWO_TILES>
__device__ __forceinline__ void multiply_stage(const GemvParams& p, const Walk<WARPS>& walk,
                                               int i, int g, int t, const Stage& st,
                                               float* acc) {
  float(&lo)[4] = *reinterpret_cast<float(*)[4]>(&acc[0]);
  float(&hi)[4] = *reinterpret_cast<float(*)[4]>(&acc[TWO_TILES ? 4 : 0]);
  const int c0 = walk.col(i);
#pragma unroll
  for (int u = 0; u < kStage; ++u) {
    const int c = c0 + u * kChunk;
    if (c >= walk.ke) break;
    RowFrags xa, xb;
    load_rows(p, g, c, t, xa);
    if (TWO_TILES) load_rows(p, 8 + g, c, t, xb);
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const uint32_t r0 = (&st.w[u][0][s >> 2].x)[s & 3];  // row g's word s
      const uint32_t r1 = (&st.w[u][1][s >> 2].x)[s & 3];  // row 8 + g's
      const uint32_t a0 = pair_lo<BF16>(r0), a1 = pair_lo<BF16>(r1);
      const uint32_t a2 = pair_hi<BF16>(r0), a3 = pair_hi<BF16>(r1);
      mma16<BF16>(lo, a0, a1, a2, a3, word(xa.v, 2 * s), word(xa.v, 2 * s + 1));
      if (TWO_TILES) mma16<BF16>(hi, a0, a1, a2, a3, word(xb.v, 2 * s), word(xb.v, 2 * s + 1));
    }
  }
}

// A slab's end: the warps' sums meet in shared memory (a buffer per slab parity, so one
// barrier a slab suffices: a warp writes a buffer again only after the next slab's barrier,
// which the first warp reaches once it has read it), and the first warp adds them in warp
// order, scales, biases, rounds and stores.
template <int WARPS, bool BF16, bool TWO_TILES>
__device__ __forceinline__ void finish_slab(const GemvParams& p, int slab, int parity,
                                            float (*sums)[TWO_TILES ? 8 : 4][32], int warp,
                                            int lane, float* acc) {
  constexpr int kAcc = TWO_TILES ? 8 : 4;
  if (WARPS > 1) {
    if (warp > 0) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) sums[parity * (WARPS - 1) + warp - 1][i][lane] = acc[i];
    }
    __syncthreads();
  }
  if (warp == 0) {
    for (int w = 0; w < WARPS - 1; ++w) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] += sums[parity * (WARPS - 1) + w][i][lane];
    }
    const int g = lane >> 2, t = lane & 3;
    const int n0 = slab * 16;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      // acc[i]: weight row n0 + g + 8 ((i >> 1) & 1), x row 8 (i >> 2) + 2t + (i & 1).
      const int m = 8 * (i >> 2) + 2 * t + (i & 1);
      const int n = n0 + g + 8 * ((i >> 1) & 1);
      if (m >= p.m) continue;
      float v = acc[i] * p.scale[n];
      if (p.bias != nullptr) v += to_float(p.bias[n], BF16);
      p.y[m * p.stride_y + n] = from_float(v, BF16);
    }
  }
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
}

// TWO_TILES: activation rows 8-15 as a second n-tile (m > 8).
template <int WARPS, bool BF16, bool TWO_TILES>
__global__ void __launch_bounds__(WARPS * 32) gemv(const GemvParams p) {
  constexpr int kAcc = TWO_TILES ? 8 : 4;
  __shared__ float sums[2 * (WARPS > 1 ? WARPS - 1 : 1)][kAcc][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const Walk<WARPS> walk(p, warp);
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  // Two stages in registers, named rather than indexed (an indexed pair would go to local
  // memory): items 0, 2, 4, ... in `even`, 1, 3, ... in `odd`.
  Stage even, odd;
  if (walk.items > 0) load_stage(p, walk, 0, g, t, even);
  for (int i = 0; i < walk.items; i += 2) {
    if (i + 1 < walk.items) load_stage(p, walk, i + 1, g, t, odd);
    multiply_stage<WARPS, BF16, TWO_TILES>(p, walk, i, g, t, even, acc);
    if (walk.last(i)) {
      finish_slab<WARPS, BF16, TWO_TILES>(p, walk.slab(i), (i / walk.groups) & 1, sums, warp,
                                          lane, acc);
    }
    if (i + 1 >= walk.items) break;
    if (i + 2 < walk.items) load_stage(p, walk, i + 2, g, t, even);
    multiply_stage<WARPS, BF16, TWO_TILES>(p, walk, i + 1, g, t, odd, acc);
    if (walk.last(i + 1)) {
      finish_slab<WARPS, BF16, TWO_TILES>(p, walk.slab(i + 1), ((i + 1) / walk.groups) & 1,
                                          sums, warp, lane, acc);
    }
  }
}

// Blocks of the kernel an SM holds at once (cached per instantiation): a persistent grid
// is the SMs times this.
template <int WARPS, bool BF16, bool TWO_TILES>
int resident_blocks() {
  static int sms = 0, per_sm = 0;
  if (sms == 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv<WARPS, BF16, TWO_TILES>,
                                                  WARPS * 32, 0);
    if (per_sm < 1) per_sm = 1;
  }
  return sms * per_sm;
}

template <int WARPS, bool BF16, bool TWO_TILES>
cudaError_t launch(const GemvParams& p, bool persistent, cudaStream_t stream) {
  const int slabs = p.n / 16;
  int blocks = slabs;
  if (persistent) blocks = min(slabs, resident_blocks<WARPS, BF16, TWO_TILES>());
  gemv<WARPS, BF16, TWO_TILES><<<blocks, WARPS * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

template <int WARPS>
cudaError_t launch(const GemvParams& p, bool persistent, cudaStream_t stream) {
  if (p.m > 8) {
    return p.x_bf16 ? launch<WARPS, true, true>(p, persistent, stream)
                    : launch<WARPS, false, true>(p, persistent, stream);
  }
  return p.x_bf16 ? launch<WARPS, true, false>(p, persistent, stream)
                  : launch<WARPS, false, false>(p, persistent, stream);
}

}  // namespace

// The C entry point (ctypes, fp8_gemv_cuda.py): `warps` per block (1, 2, 4, 8 or 16; at
// most k / 128); `persistent`: a grid of at most the blocks the SMs hold at once, each
// walking several slabs, rather than a block per slab. Returns a cudaError_t;
// cudaErrorInvalidValue for shapes it does not take (m in [1, 16], n a multiple of 16, k
// a multiple of 128; x's and w's rows 16-byte aligned, which the caller checks).
extern "C" int radixmesh_fp8_gemv(const GemvParams* p, int warps, int persistent,
                                  int64_t stream) {
  if (p->m < 1 || p->m > 16 || p->n % 16 || p->k % kChunk || warps * kChunk > p->k) {
    return cudaErrorInvalidValue;
  }
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const bool pers = persistent != 0;
  if (warps == 1) return launch<1>(*p, pers, s);
  if (warps == 2) return launch<2>(*p, pers, s);
  if (warps == 4) return launch<4>(*p, pers, s);
  if (warps == 8) return launch<8>(*p, pers, s);
  if (warps == 16) return launch<16>(*p, pers, s);
  return cudaErrorInvalidValue;
}

extern "C" int radixmesh_fp8_gemv_params_size() { return (int)sizeof(GemvParams); }
