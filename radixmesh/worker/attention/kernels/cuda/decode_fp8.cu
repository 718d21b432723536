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
// Layout (g = lane / 4, t = lane % 4; the mma fragments' own names):
// - Scores S = Q K^T: A = Q, its 16 rows the group's query heads (rows >= group and the
//   fragment's rows 8-15 are zero); B = K^T, a 16-key tile as two n-tiles of 8 keys. The
//   sum over the head dim is taken in a permuted order so that thread (g, t) reads key
//   (8n + g)'s dims [32t, 32t + 32) with two 16-byte loads: k-step s, rows 2t and 2t + 1
//   are dims 32t + 4s + {0, 1}, rows 2t + 8 and 2t + 9 are dims 32t + 4s + {2, 3}. Its
//   query fragment follows the same order.
// - Output O = P V: A = the softmax weights, straight from S's accumulators (thread (g,
//   t) holds keys 2t, 2t + 1, 8 + 2t, 9 + 2t of row g: the A fragment's k order); B = V,
//   with column n of n-tile j standing for dim 16n + j, so thread (g, t) reads dims [16g,
//   16g + 16) of its four keys (one 16-byte load each) and byte-permutes two keys' words
//   into fp16 pairs. The output columns it accumulates are then dims [32t, 32t + 32).
// - Per-token exponents: the four keys whose scores a thread holds are the four it reads
//   values of, so each thread loads exactly the exponents it applies.
// - Softmax: m, the running max of the scores (log2 units), gives the normalizer l =
//   sum 2^(s - m); M, the running max of s + e_v, gives the weights 2^(s + e_v - M) <= 1
//   that go to the matrix unit in fp16, and acc = sum 2^(s + e_v - M) v. The output is
//   acc 2^(M - m) / l.

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

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

constexpr int kHeadDim = 128;
constexpr int kTile = 16;  // keys per tile (one mma k-step of the output product)

__device__ __forceinline__ float pow2(int e) {  // e in [-126, 127]: 2^e exactly
  return __int_as_float((e + 127) << 23);
}

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {  // low byte -> low half
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
  return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// d += A B for rows 0-7 of the tile; rows 8-15 (A's a1, a3) are zero and their results
// dropped.
__device__ __forceinline__ void mma_rows8(float& d0, float& d1, uint32_t a0, uint32_t a2,
                                          uint32_t b0, uint32_t b1) {
  float z2, z3;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %10, %11};\n"
      : "+f"(d0), "+f"(d1), "=f"(z2), "=f"(z3)
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(0.f), "f"(0.f));
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ uint4 load16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// One tile's operands in registers: keys (two n-tiles x 32 bytes), values (four keys x 16
// bytes), the four keys' exponents.
struct TileRegs {
  uint4 k[2][2];
  uint4 v[4];
  int e_k[4];
  int e_v[4];
};

// A tile's slots: keys g and 8 + g (the thread's keys of the score product), then 2t,
// 2t + 1, 8 + 2t, 9 + 2t (its keys of the output product). Loaded a tile ahead, so that a
// tile's value loads wait for one memory latency, not for a slot's and then a value's.
struct TileSlots {
  int32_t s[6];
};

struct Block {
  const Params& p;
  const int64_t* table_row;  // this sequence's row of the slot table
  int64_t head_off;          // kv head's offset in a slot's values
  int64_t lo, hi;            // this block's keys
  int kv_head, g, t;

  __device__ __forceinline__ void slots(int64_t n0, TileSlots& r) const {
    const int64_t last = hi - 1;  // keys past the end read the last one's (valid) bytes
    r.s[0] = (int32_t)__ldg(table_row + min(n0 + g, last));
    r.s[1] = (int32_t)__ldg(table_row + min(n0 + 8 + g, last));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.s[2 + i] = (int32_t)__ldg(table_row + min(n0 + 2 * t + (i & 1) + 8 * (i >> 1), last));
    }
  }

  __device__ __forceinline__ void load(const TileSlots& sl, TileRegs& r) const {
    const uint8_t* kb = p.k + head_off + 32 * t;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const uint8_t* src = kb + (int64_t)sl.s[n] * p.stride_buf_slot;
      r.k[n][0] = load16(src);
      r.k[n][1] = load16(src + 16);
    }
    const uint8_t* vb = p.v + head_off + 16 * g;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t slot = sl.s[2 + i];
      r.v[i] = load16(vb + slot * p.stride_buf_slot);
      const int64_t e = slot * p.stride_scale_slot + kv_head;
      r.e_k[i] = __ldg(p.k_exp + e);
      r.e_v[i] = __ldg(p.v_exp + e);
    }
  }
};

// A block's query (row g of the mma tile: a head of the group or zero), as the score
// product's A fragments, and its scale back to scores in log2 units.
struct Query {
  uint32_t qa[8][2];  // k-step s: dims 32t + 4s + {0, 1} and {2, 3}
  float scale;
};

__device__ __forceinline__ Query load_query(const Params& p, int b, int kv_head, int g, int t) {
  // Row g's dims [32t, 32t + 32), as fp16 after a power-of-two shift that brings the
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
  int e_q = 0;  // ceil(log2(amax / 2^14)), clamped; any for a zero row
  if (amax > 0.f) {
    int e;
    const float m = frexpf(amax * (1.f / 16384.f), &e);
    e_q = min(max(m == 0.5f ? e - 1 : e, -126), 126);
  }
  const float shift = pow2(-e_q);
  Query q;
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    q.qa[s][0] = pack_f16x2(qf[4 * s] * shift, qf[4 * s + 1] * shift);
    q.qa[s][1] = pack_f16x2(qf[4 * s + 2] * shift, qf[4 * s + 3] * shift);
  }
  q.scale = p.scale_log2 * pow2(e_q);
  return q;
}

// A warp's online softmax over its keys, row g.
struct State {
  float acc[16][2];  // dims 32t + j (acc[j][0]) and 32t + 16 + j (acc[j][1])
  float m, big_m, l;  // l: this thread's share (its four keys a tile), summed at the end
};

// One 16-key tile starting at key n0 (keys >= hi masked) into the warp's state.
__device__ __forceinline__ void compute_tile(State& st, const TileRegs& r, const Query& q,
                                             int64_t n0, int64_t hi, int t) {
  float s[4] = {0.f, 0.f, 0.f, 0.f};  // keys 2t, 2t + 1, 8 + 2t, 9 + 2t
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const uint32_t w[8] = {r.k[n][0].x, r.k[n][0].y, r.k[n][0].z, r.k[n][0].w,
                           r.k[n][1].x, r.k[n][1].y, r.k[n][1].z, r.k[n][1].w};
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      mma_rows8(s[2 * n], s[2 * n + 1], q.qa[ks][0], q.qa[ks][1],
                e4m3x2_to_f16x2(w[ks] & 0xffffu), e4m3x2_to_f16x2(w[ks] >> 16));
    }
  }
  float u_v[4];  // s + e_v: the weight's log2 before the running max M
  float tile_max = -CUDART_INF_F, tile_umax = -CUDART_INF_F;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t key = n0 + 2 * t + (i & 1) + 8 * (i >> 1);
    s[i] = key < hi ? s[i] * pow2(r.e_k[i]) * q.scale : -CUDART_INF_F;
    u_v[i] = s[i] + (float)r.e_v[i];
    tile_max = fmaxf(tile_max, s[i]);
    tile_umax = fmaxf(tile_umax, u_v[i]);
  }
  const float m_new = fmaxf(st.m, quad_max(tile_max));  // finite: key n0 is valid
  const float big_new = fmaxf(st.big_m, quad_max(tile_umax));
  const float alpha = exp2f(st.m - m_new);
  const float beta = exp2f(st.big_m - big_new);
  float w[4];
  float psum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    psum += exp2f(s[i] - m_new);
    w[i] = exp2f(u_v[i] - big_new);
  }
  st.l = st.l * alpha + psum;
  st.m = m_new;
  st.big_m = big_new;
  const uint32_t pa0 = pack_f16x2(w[0], w[1]);
  const uint32_t pa2 = pack_f16x2(w[2], w[3]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // word i of each key: dims 16g + 4i + {0..3}
    const uint32_t v0 = (&r.v[0].x)[i], v1 = (&r.v[1].x)[i];
    const uint32_t v2 = (&r.v[2].x)[i], v3 = (&r.v[3].x)[i];
    const uint32_t x01 = __byte_perm(v0, v1, 0x5140), y01 = __byte_perm(v0, v1, 0x7362);
    const uint32_t x23 = __byte_perm(v2, v3, 0x5140), y23 = __byte_perm(v2, v3, 0x7362);
    const uint32_t b0[4] = {e4m3x2_to_f16x2(x01 & 0xffffu), e4m3x2_to_f16x2(x01 >> 16),
                            e4m3x2_to_f16x2(y01 & 0xffffu), e4m3x2_to_f16x2(y01 >> 16)};
    const uint32_t b1[4] = {e4m3x2_to_f16x2(x23 & 0xffffu), e4m3x2_to_f16x2(x23 >> 16),
                            e4m3x2_to_f16x2(y23 & 0xffffu), e4m3x2_to_f16x2(y23 >> 16)};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int j = 4 * i + c;  // n-tile: column n is dim 16n + j
      st.acc[j][0] *= beta;
      st.acc[j][1] *= beta;
      mma_rows8(st.acc[j][0], st.acc[j][1], pa0, pa2, b0[c], b1[c]);
    }
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
// written as the split's partial output and
// log2-sum-exp. A row's dims [32t, 32t + 32) at t * 36 floats: a quarter warp's 16-byte
// stores hit distinct banks.
template <int WARPS>
__host__ __device__ constexpr int combine_bytes() {
  return WARPS * 8 * (4 * 9 * 16 + 3 * 4);
}

template <int WARPS>
__device__ __forceinline__ void combine_and_store(const Params& p, const Range& r,
                                                  State& st, int kv_head, void* smem) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  st.l = quad_sum(st.l);
  float4(*s_acc)[8][4][9] = reinterpret_cast<float4(*)[8][4][9]>(smem);
  float(*s_m)[8] = reinterpret_cast<float(*)[8]>(s_acc + WARPS);
  float(*s_big)[8] = s_m + WARPS;
  float(*s_l)[8] = s_big + WARPS;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    s_acc[warp][g][t][j] = make_float4(st.acc[4 * j][0], st.acc[4 * j + 1][0],
                                       st.acc[4 * j + 2][0], st.acc[4 * j + 3][0]);
    s_acc[warp][g][t][4 + j] = make_float4(st.acc[4 * j][1], st.acc[4 * j + 1][1],
                                           st.acc[4 * j + 2][1], st.acc[4 * j + 3][1]);
  }
  if (t == 0) {
    s_m[warp][g] = st.m;
    s_big[warp][g] = st.big_m;
    s_l[warp][g] = st.l;
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
        num += (&s_acc[w][row][d / 32][0].x)[d % 32] * exp2f(s_big[w][row] - m_all);
      }
    }
    const int64_t o = r.mid_row + (int64_t)(kv_head * p.group + row) * p.stride_mid_h;
    p.mid_o[o + d] = num / den;
    if (d == 0) p.mid_l[o / kHeadDim] = m_all + log2f(den);
  }
}

__device__ __forceinline__ void init_state(State& st) {
#pragma unroll
  for (int j = 0; j < 16; ++j) st.acc[j][0] = st.acc[j][1] = 0.f;
  st.m = st.big_m = -CUDART_INF_F;
  st.l = 0.f;
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
  const Block blk{p, p.req_to_token + p.req_rows[b] * p.stride_table,
                  (int64_t)kv_head * p.stride_buf_head, r.lo, r.hi, kv_head, g, t};
  State st;
  init_state(st);
  constexpr int64_t kStride = (int64_t)WARPS * kTile;  // keys between a warp's tiles
  const int64_t first = r.lo + (int64_t)warp * kTile;
  TileSlots slots;
  if (first < r.hi) blk.slots(first, slots);
  for (int64_t n0 = first; n0 < r.hi; n0 += kStride) {
    TileRegs regs;
    blk.load(slots, regs);
    if (n0 + kStride < r.hi) blk.slots(n0 + kStride, slots);  // in flight meanwhile
    compute_tile(st, regs, q, n0, r.hi, t);
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
