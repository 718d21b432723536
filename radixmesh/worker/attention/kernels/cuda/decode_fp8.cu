// Decode attention over an FP8 KV pool, stage 1 (flash-decoding's split): each
// (split, KV head, sequence) block writes its partial output and log2-sum-exp into the
// same workspace as the Triton kernels (decode_attention.py), merged by their stage 2.
//
// Why CUDA and not Triton: on the H200 the Triton kernels over an FP8 pool were bound by
// the layouts Triton chose (cross-warp softmax reductions, byte-wise shared loads, ~200
// registers a thread), not by bytes (docs/performance.md, "FP8 KV decode"). Here each warp
// owns its keys and its softmax state, and a thread reads exactly the bytes it multiplies
// (16-byte loads; no shared tile, no barrier inside the loop); blocks combine their warps
// once, at the end. Tiles go straight into registers; each tile's slots are read a tile
// ahead. (Copying tiles asynchronously into a per-warp shared-memory ring of 3-4 stages
// instead measured 1.3-1.5x slower on the H200: docs/performance.md, "FP8 KV decode".)
//
// Numerics are those of the Triton conversion path (exact to the pool's values): e4m3
// keys and values become fp16 (which holds every e4m3 value exactly) with one `cvt` per
// two values, the query is shifted per head by a power of two into fp16's range (undone
// on the scores), the products run on the fp16 matrix unit (mma.sync m16n8k16, float32
// accumulators), and each token's power-of-two exponents scale its score (keys) and its
// softmax weight (values), not its bytes.
//
// Layout (g = lane / 4, t = lane % 4; the mma fragments' own names). Both products are
// taken transposed, so that the keys (scores) and the head dim (output) fill the matrix
// unit's 16 rows and the group's query heads its 8 columns: no row of either product is
// padding, and each is 8 mma a tile.
// - Scores S^T = K Q^T: A = K, a 16-key tile (rows g and 8 + g are the thread's keys);
//   B = Q^T, column g the group's head g (zero past the group). The sum over the head dim
//   is taken in a permuted order so that thread (g, t) reads its keys' dims [32t, 32t +
//   32) with two 16-byte loads each: in k-step s, columns 2t and 2t + 1 are dims 32t + 4s
//   + {0, 1}, columns 2t + 8 and 2t + 9 dims 32t + 4s + {2, 3}, so word s of a key's
//   bytes is one A register pair (its halves converted in place). The query's B fragment
//   (head g's dims [32t, 32t + 32)) follows the same order. The accumulators: keys g and
//   8 + g, heads 2t and 2t + 1.
// - Softmax per head over the tile's keys: a reduction over the 8 lanes of a column.
// - Output O^T = V^T P^T: B = P^T (keys 2t, 2t + 1, 8 + 2t, 9 + 2t of head g), which is
//   the scores' accumulator layout transposed, 8 x 8 at a time (`movmatrix`); A = V^T, its
//   row r of mma j standing for dim 16r + 2j (r < 8) or 16(r - 8) + 2j + 1, so thread (g,
//   t) reads dims [16g, 16g + 16) of its four keys (one 16-byte load each) and
//   byte-permutes two keys' words into fp16 pairs. The thread accumulates dims [16g, 16g
//   + 16) of heads 2t and 2t + 1: the heads whose softmax state it holds.
// - Per-token exponents: the two keys a thread holds scores of take its two k and two v
//   exponents (the latter scale the softmax weights, before the transpose).
// - Softmax: m, a running reference for the scores (log2 units), gives the normalizer l =
//   sum 2^(s - m); M, one for s + e_v, gives the weights 2^(s + e_v - M) that go to the
//   matrix unit in fp16, and acc = sum 2^(s + e_v - M) v. The output is acc 2^(M - m) / l.
//   The references are maxima of earlier tiles, raised (and l and acc rescaled) only when
//   a tile exceeds one of them by more than kSlack: weights stay <= 2^kSlack (far inside
//   fp16's range, and rounded as finely as weights <= 1), and most tiles skip the
//   reductions and the rescale.

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "fp8_mma.cuh"  // worker/cuda/: e4m3 pairs, mma, 16-byte loads, powers of two

// The parameter block (decode_fp8_cuda.py's `_Params`, field for field): outside the
// anonymous namespace, so that the extern "C" entry point taking it keeps external linkage.
struct Params {
  const uint16_t* q;  // [B, Hq, D] bf16 or fp16 bits
  const uint8_t* k;   // [slots, Hkv, D] e4m3
  const uint8_t* v;
  const int8_t* k_exp;  // [slots, Hkv] (stride_scale_slot): 2^e scales a token's values
  const int8_t* v_exp;
  float* mid_o;  // [B, Hq, S, D]
  float* mid_l;  // [B, Hq, S]
  const int64_t* req_to_token;
  const int64_t* req_rows;
  const int64_t* seq_lens;
  float scale_log2;
  int32_t num_splits;
  int32_t num_kv_heads;
  int32_t group;
  int32_t q_bf16;
  int32_t pad;
  int64_t stride_qt, stride_qh;
  int64_t stride_buf_slot, stride_buf_head;
  int64_t stride_scale_slot;
  int64_t stride_table;
  int64_t stride_mid_b, stride_mid_h, stride_mid_s;
};

namespace {

using namespace radixmesh;

constexpr int kHeadDim = 128;
constexpr int kTile = 16;      // keys per tile: the score product's 16 rows
constexpr float kSlack = 8.f;  // log2 units a tile may pass the references by (see above)
__device__ __forceinline__ float ex2(float x) {  // 2^x; 2^-inf = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// An 8 x 8 matrix of 16-bit values in the mma fragment layout (thread (g, t): row g,
// columns 2t and 2t + 1), transposed.
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Across the 8 lanes of a column (lanes t, 4 + t, ..., 28 + t).
__device__ __forceinline__ float column_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kAll, x, 4));
  x = fmaxf(x, __shfl_xor_sync(kAll, x, 8));
  return fmaxf(x, __shfl_xor_sync(kAll, x, 16));
}

__device__ __forceinline__ float column_sum(float x) {
  x += __shfl_xor_sync(kAll, x, 4);
  x += __shfl_xor_sync(kAll, x, 8);
  return x + __shfl_xor_sync(kAll, x, 16);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kAll, x, 1));
  return fmaxf(x, __shfl_xor_sync(kAll, x, 2));
}

// One tile's operands in registers: keys g and 8 + g (32 bytes each), values of keys 2t,
// 2t + 1, 8 + 2t, 9 + 2t (16 bytes each), the exponents of keys g and 8 + g.
struct TileRegs {
  uint4 k[2][2];
  uint4 v[4];
  int e_k[2];
  int e_v[2];
};

// A tile's slots: keys g and 8 + g, then 2t, 2t + 1, 8 + 2t, 9 + 2t. Loaded a tile ahead,
// so that a tile's value loads wait for one memory latency, not for a slot's and then a
// value's.
struct TileSlots {
  int32_t s[6];
};

// base + i elements, i in [0, 2^31): one wide multiply-add, no sign extension.
template <typename T>
__device__ __forceinline__ const T* at(const T* base, int i, int stride = 1) {
  return reinterpret_cast<const T*>(reinterpret_cast<const char*>(base) +
                                    (uint64_t)(uint32_t)i * (uint32_t)(stride * sizeof(T)));
}

struct Block {
  const int64_t* table_row;  // this sequence's row of the slot table
  const uint8_t* k;          // the KV head's keys in slot 0, at thread (g, t)'s bytes
  const uint8_t* v;          // its values in slot 0, at the thread's bytes
  const int8_t* k_exp;       // its exponents in slot 0
  const int8_t* v_exp;
  int stride_slot, stride_scale;
  int hi;  // this block's keys end
  int g, t;

  __device__ __forceinline__ void slots(int n0, TileSlots& r) const {
    const int last = hi - 1;  // keys past the end read the last one's (valid) bytes
    r.s[0] = (int32_t)__ldg(at(table_row, min(n0 + g, last)));
    r.s[1] = (int32_t)__ldg(at(table_row, min(n0 + 8 + g, last)));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.s[2 + i] = (int32_t)__ldg(at(table_row, min(n0 + 2 * t + (i & 1) + 8 * (i >> 1), last)));
    }
  }

  __device__ __forceinline__ void load(const TileSlots& sl, TileRegs& r) const {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const uint8_t* src = at(k, sl.s[n], stride_slot);
      r.k[n][0] = load16(src);
      r.k[n][1] = load16(src + 16);
      r.e_k[n] = __ldg(at(k_exp, sl.s[n], stride_scale));
      r.e_v[n] = __ldg(at(v_exp, sl.s[n], stride_scale));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) r.v[i] = load16(at(v, sl.s[2 + i], stride_slot));
  }
};

// A block's query: head g of the group (or zero) as the score product's B fragments, and
// its scale back to scores in log2 units.
struct Query {
  uint32_t qb[8][2];  // k-step s: dims 32t + 4s + {0, 1} and {2, 3}
  float scale;
};

__device__ __forceinline__ Query load_query(const Params& p, int b, int kv_head, int g, int t) {
  // Head g's dims [32t, 32t + 32), as fp16 after a power-of-two shift that brings the
  // head's max |q| to at most 2^14.
  float qf[32];
  if (g < p.group) {
    const int head = kv_head * p.group + g;
    const uint4* src = reinterpret_cast<const uint4*>(p.q + b * p.stride_qt +
                                                      head * p.stride_qh + 32 * t);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 w = src[i];
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo16 = words[j] & 0xffffu, hi16 = words[j] >> 16;
        if (p.q_bf16) {
          qf[8 * i + 2 * j] = __uint_as_float(lo16 << 16);
          qf[8 * i + 2 * j + 1] = __uint_as_float(hi16 << 16);
        } else {
          qf[8 * i + 2 * j] = __half2float(__ushort_as_half((unsigned short)lo16));
          qf[8 * i + 2 * j + 1] = __half2float(__ushort_as_half((unsigned short)hi16));
        }
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) qf[i] = 0.f;
  }
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(qf[i]));
  amax = quad_max(amax);
  const int e_q = fp16_shift_exponent(amax);
  const float shift = pow2(-e_q);
  Query q;
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    q.qb[s][0] = pack_f16x2(qf[4 * s] * shift, qf[4 * s + 1] * shift);
    q.qb[s][1] = pack_f16x2(qf[4 * s + 2] * shift, qf[4 * s + 3] * shift);
  }
  q.scale = p.scale_log2 * pow2(e_q);
  return q;
}

// A warp's online softmax over its keys, heads 2t + c (c = 0, 1).
struct State {
  float acc[8][4];  // mma j: dim 16g + 2j of heads 2t, 2t + 1; dim 16g + 2j + 1 of both
  float m[2], big_m[2];  // the references (the same in the 8 lanes of a column)
  float l[2];            // this thread's share (its two keys a tile), summed at the end
};

// One 16-key tile starting at key n0 (keys >= hi masked) into the warp's state;
// q_scale[c]: head 2t + c's scale of the scores.
__device__ __forceinline__ void compute_tile(State& st, const TileRegs& r, const Query& q,
                                             const float (&q_scale)[2], int n0, int hi,
                                             int g) {
  float sc[4] = {0.f, 0.f, 0.f, 0.f};  // (key g, head 2t), (g, 2t + 1), (8 + g, 2t), (8 + g, 2t + 1)
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const uint32_t w0 = (&r.k[0][ks >> 2].x)[ks & 3];  // key g's word ks
    const uint32_t w1 = (&r.k[1][ks >> 2].x)[ks & 3];  // key 8 + g's
    mma(sc, e4m3x2_lo(w0), e4m3x2_lo(w1), e4m3x2_hi(w0), e4m3x2_hi(w1), q.qb[ks][0],
        q.qb[ks][1]);
  }
  float s[2][2], u[2][2];  // [head c][key 8r + g]: the score, and the score + e_v
  float tile_max[2], tile_umax[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const bool valid = n0 + 8 * rr + g < hi;
      s[c][rr] = valid ? sc[2 * rr + c] * (pow2(r.e_k[rr]) * q_scale[c]) : -CUDART_INF_F;
      u[c][rr] = s[c][rr] + (float)r.e_v[rr];
    }
    tile_max[c] = fmaxf(s[c][0], s[c][1]);
    tile_umax[c] = fmaxf(u[c][0], u[c][1]);
  }
  const bool over = tile_max[0] > st.m[0] + kSlack || tile_max[1] > st.m[1] + kSlack ||
                    tile_umax[0] > st.big_m[0] + kSlack || tile_umax[1] > st.big_m[1] + kSlack;
  if (__any_sync(kAll, over)) {  // new references for the warp, and the state rescaled
    float beta[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float m_new = fmaxf(st.m[c], column_max(tile_max[c]));  // finite: key n0 is valid
      const float big_new = fmaxf(st.big_m[c], column_max(tile_umax[c]));
      st.l[c] *= ex2(st.m[c] - m_new);
      beta[c] = ex2(st.big_m[c] - big_new);
      st.m[c] = m_new;
      st.big_m[c] = big_new;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      st.acc[j][0] *= beta[0];
      st.acc[j][1] *= beta[1];
      st.acc[j][2] *= beta[0];
      st.acc[j][3] *= beta[1];
    }
  }
  float w[2][2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    st.l[c] += ex2(s[c][0] - st.m[c]) + ex2(s[c][1] - st.m[c]);
    w[c][0] = ex2(u[c][0] - st.big_m[c]);
    w[c][1] = ex2(u[c][1] - st.big_m[c]);
  }
  // P^T's B fragments: keys 2t, 2t + 1 (b0) and 8 + 2t, 9 + 2t (b1) of head g.
  const uint32_t b0 = transpose8x8(pack_f16x2(w[0][0], w[1][0]));
  const uint32_t b1 = transpose8x8(pack_f16x2(w[0][1], w[1][1]));
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // word i of each key: dims 16g + 4i + {0..3}
    const uint32_t v0 = (&r.v[0].x)[i], v1 = (&r.v[1].x)[i];
    const uint32_t v2 = (&r.v[2].x)[i], v3 = (&r.v[3].x)[i];
    const uint32_t x01 = __byte_perm(v0, v1, 0x5140), y01 = __byte_perm(v0, v1, 0x7362);
    const uint32_t x23 = __byte_perm(v2, v3, 0x5140), y23 = __byte_perm(v2, v3, 0x7362);
    // mma 2i: dims 16g + 4i (rows < 8) and + 1 (rows >= 8); mma 2i + 1: + 2 and + 3.
    mma(st.acc[2 * i], e4m3x2_lo(x01), e4m3x2_hi(x01), e4m3x2_lo(x23), e4m3x2_hi(x23), b0, b1);
    mma(st.acc[2 * i + 1], e4m3x2_lo(y01), e4m3x2_hi(y01), e4m3x2_lo(y23), e4m3x2_hi(y23), b0,
        b1);
  }
}

// The block's keys [lo, hi) of split `split`: whole tiles of `step` keys.
struct Range {
  int64_t lo, hi, mid_row;
};

__device__ __forceinline__ Range split_range(const Params& p, int b, int split, int step) {
  const int64_t seq_len = p.seq_lens[b];
  int64_t per = (seq_len + p.num_splits - 1) / p.num_splits;
  per = (per + step - 1) / step * step;
  const int64_t lo = split * per;
  return {lo, min(lo + per, seq_len), b * p.stride_mid_b + split * p.stride_mid_s};
}

// An empty split: no output, lse -inf (the merge weighs it 0).
__device__ __forceinline__ void store_empty(const Params& p, const Range& r, int kv_head,
                                            int threads) {
  for (int i = threadIdx.x; i < p.group * kHeadDim; i += threads) {
    const int h = kv_head * p.group + i / kHeadDim;
    p.mid_o[r.mid_row + h * p.stride_mid_h + i % kHeadDim] = 0.f;
    if (i % kHeadDim == 0) p.mid_l[(r.mid_row + h * p.stride_mid_h) / kHeadDim] = -CUDART_INF_F;
  }
}

// The block's warps combined through shared memory (`smem`, combine_bytes<WARPS>() bytes),
// written as the split's partial output and log2-sum-exp. A head's row of kRowFloats:
// the pad spreads a quarter warp's 16-byte stores over the banks.
constexpr int kRowFloats = kHeadDim + 4;

template <int WARPS>
__host__ __device__ constexpr int combine_bytes() {
  return WARPS * (8 * kRowFloats + 3 * 8) * 4;
}

template <int WARPS>
__device__ __forceinline__ void combine_and_store(const Params& p, const Range& r,
                                                  State& st, int kv_head, void* smem) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  float(*s_acc)[8][kRowFloats] = reinterpret_cast<float(*)[8][kRowFloats]>(smem);
  float(*s_m)[8] = reinterpret_cast<float(*)[8]>(s_acc + WARPS);
  float(*s_big)[8] = s_m + WARPS;
  float(*s_l)[8] = s_big + WARPS;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const float l = column_sum(st.l[c]);
    float* row = s_acc[warp][2 * t + c] + 16 * g;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // dims 16g + 4i + {0..3}: mma 2i's and 2i + 1's
      reinterpret_cast<float4*>(row)[i] =
          make_float4(st.acc[2 * i][c], st.acc[2 * i][2 + c], st.acc[2 * i + 1][c],
                      st.acc[2 * i + 1][2 + c]);
    }
    if (g == 0) {
      s_m[warp][2 * t + c] = st.m[c];
      s_big[warp][2 * t + c] = st.big_m[c];
      s_l[warp][2 * t + c] = l;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < p.group * kHeadDim; i += WARPS * 32) {
    const int row = i / kHeadDim, d = i % kHeadDim;
    float m_all = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) m_all = fmaxf(m_all, s_m[w][row]);
    float den = 0.f, num = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      if (s_l[w][row] > 0.f) {  // a warp with no keys holds m = M = -inf
        den += s_l[w][row] * exp2f(s_m[w][row] - m_all);
        num += s_acc[w][row][d] * exp2f(s_big[w][row] - m_all);
      }
    }
    const int64_t o = r.mid_row + (int64_t)(kv_head * p.group + row) * p.stride_mid_h;
    p.mid_o[o + d] = num / den;
    if (d == 0) p.mid_l[o / kHeadDim] = m_all + log2f(den);
  }
}

__device__ __forceinline__ void init_state(State& st) {
#pragma unroll
  for (int j = 0; j < 8; ++j) st.acc[j][0] = st.acc[j][1] = st.acc[j][2] = st.acc[j][3] = 0.f;
  st.m[0] = st.m[1] = st.big_m[0] = st.big_m[1] = -CUDART_INF_F;
  st.l[0] = st.l[1] = 0.f;
}

// Tiles into registers, a warp's 16-key tiles one at a time; each tile's slots come a
// tile ahead. (Prefetching the next tile's bytes into L2 as well measured slower on the
// H200: docs/performance.md, "FP8 KV decode".)
template <int WARPS, int MIN_BLOCKS>
__global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS)
    decode_fp8_split(const Params p) {
  const int split = blockIdx.x, kv_head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const Range r = split_range(p, b, split, kTile);
  __shared__ __align__(16) unsigned char smem[combine_bytes<WARPS>()];
  if (r.lo >= r.hi) {
    store_empty(p, r, kv_head, WARPS * 32);
    return;
  }
  const Query q = load_query(p, b, kv_head, g, t);
  // The scales of heads 2t and 2t + 1 (held by lanes 8t and 8t + 4).
  const float q_scale[2] = {__shfl_sync(kAll, q.scale, 8 * t),
                            __shfl_sync(kAll, q.scale, 8 * t + 4)};
  const int head_off = kv_head * (int)p.stride_buf_head;
  const Block blk{p.req_to_token + p.req_rows[b] * p.stride_table,
                  p.k + head_off + 32 * t,
                  p.v + head_off + 16 * g,
                  p.k_exp + kv_head,
                  p.v_exp + kv_head,
                  (int)p.stride_buf_slot,
                  (int)p.stride_scale_slot,
                  (int)r.hi,
                  g,
                  t};
  State st;
  init_state(st);
  constexpr int kStride = WARPS * kTile;  // keys between a warp's tiles
  const int first = (int)r.lo + warp * kTile;
  TileSlots slots;
  if (first < blk.hi) blk.slots(first, slots);
  for (int n0 = first; n0 < blk.hi; n0 += kStride) {
    TileRegs regs;
    blk.load(slots, regs);
    if (n0 + kStride < blk.hi) blk.slots(n0 + kStride, slots);  // in flight meanwhile
    compute_tile(st, regs, q, q_scale, n0, blk.hi, g);
  }
  combine_and_store<WARPS>(p, r, st, kv_head, smem);
}

template <int WARPS, int MIN_BLOCKS>
cudaError_t launch(const Params& p, int batch, cudaStream_t stream) {
  const dim3 grid(p.num_splits, p.num_kv_heads, batch);
  decode_fp8_split<WARPS, MIN_BLOCKS><<<grid, WARPS * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

// The launchers' C entry point (ctypes, decode_fp8_cuda.py): `warps` per block,
// `min_blocks` resident blocks an SM is compiled for (0: no register cap). Returns a
// cudaError_t; cudaErrorInvalidValue for a launch that is not compiled.
extern "C" int radixmesh_decode_fp8_split(const Params* p, int batch, int warps,
                                          int min_blocks, int64_t stream) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (warps == 2 && min_blocks == 8) return launch<2, 8>(*p, batch, s);
  if (warps == 4 && min_blocks == 0) return launch<4, 0>(*p, batch, s);
  return cudaErrorInvalidValue;
}

extern "C" int radixmesh_decode_fp8_params_size() { return (int)sizeof(Params); }
