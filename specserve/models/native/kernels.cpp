// specserve native CPU kernels: AVX2 + FMA + F16C, fp32 activations, OpenMP over independent work.
//
// Every kernel computes each output element with one fixed sequence of floating-point operations
// that depends only on that element's inputs, never on how many rows, tokens or cache slots share
// the call, nor on how the work is split between threads.  That makes the runtime batch-invariant
// by construction: a token scored alone in a decoding pass and inside a (k+1)-token verification
// pass, alone or batched, gets bit-identical logits.
//
//   linear:    y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) (+ y[m, n] when accumulating).
//              w is stored as GGUF blocks (Q4_1, Q8_0) or as F16/F32 rows and dequantized
//              exactly (the values gguf's reference dequantizer produces).  One 8-lane FMA
//              accumulator per output element runs over k in increasing order; the 8 lanes are
//              then summed in a fixed tree.  Tiling over m and n only changes which elements are
//              computed together, not how any one is computed.
//   attention: per (token, head): scores over keys 0..pos in key order, max, exp, a lane-wise sum
//              whose lane of key j is j % 8 and whose padding lanes add exact zeros, then
//              sum_j p_j v_j in key order.  Keys past the token's own position are never read.
//   rmsnorm, rope + cache write, silu*mul, embedding gather: elementwise or per-row, fixed order.
//
// Compiled with -ffp-contract=off so that what is written is what runs.

#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

#ifndef M1_ROWS
#define M1_ROWS 2
#endif
#ifndef MT_ROWS
#define MT_ROWS 3
#endif
#ifndef M1_FUSED
#define M1_FUSED 1
#endif

enum Fmt : int { F32 = 0, F16 = 1, Q8_0 = 2, Q4_1 = 3 };

inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Fixed-order horizontal sum of 8 lanes: (l0+l4, l1+l5, l2+l6, l3+l7) -> (a0+a2, a1+a3) -> b0+b1.
inline float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
  __m128 c = _mm_add_ss(b, _mm_shuffle_ps(b, b, 1));
  return _mm_cvtss_f32(c);
}

// Per-format block geometry and exact dequantization of block `b` of a row into `out`.
template <int F> struct Blk;
template <> struct Blk<F32> {
  static constexpr int size = 8, vecs = 1, bytes = 32;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    out[0] = _mm256_loadu_ps(reinterpret_cast<const float*>(row) + b * 8);
  }
};
template <> struct Blk<F16> {
  static constexpr int size = 8, vecs = 1, bytes = 16;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    out[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * 16)));
  }
};
// Q8_0: {fp16 d; int8 q[32]}; w = d * q.
template <> struct Blk<Q8_0> {
  static constexpr int size = 32, vecs = 4, bytes = 34;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 34;
    const __m256 d = _mm256_set1_ps(h2f(p));
    for (int c = 0; c < 4; ++c) {
      __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 + 8 * c)));
      out[c] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
    }
  }
};
// Q4_1: {fp16 d; fp16 m; uint8 qs[16]}; element j < 16 is the low nibble of qs[j], element j + 16
// its high nibble; w = d * q + m.  d * q is exact in fp32, so fma(d, q, m) rounds once, exactly as
// gguf's numpy code (d * q) + m does.
template <> struct Blk<Q4_1> {
  static constexpr int size = 32, vecs = 4, bytes = 20;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 20;
    const __m256 d = _mm256_set1_ps(h2f(p)), m = _mm256_set1_ps(h2f(p + 2));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    out[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m);
    out[1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), m);
    out[2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m);
    out[3] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), m);
  }
};

// MB tokens x NB output rows, weights dequantized on the fly.  x rows have stride K, y rows N.
// The loops over i, j and c are fully unrolled so that the MB*NB accumulators live in registers.
template <int F, int MB, int NB>
inline void tile(const float* x, int64_t K, const uint8_t* w, int64_t rb, float* y, int64_t N,
                 const float* bias, bool accumulate) {
  constexpr int V = Blk<F>::vecs;
  __m256 acc[MB][NB];
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t nblocks = K / Blk<F>::size;
  for (int64_t b = 0; b < nblocks; ++b) {
    if constexpr (V == 1) {              // float rows: weights in registers, one x load per token
      __m256 wv[NB];
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) Blk<F>::load(w + j * rb, b, &wv[j]);
#pragma GCC unroll 8
      for (int i = 0; i < MB; ++i) {
        const __m256 xv = _mm256_loadu_ps(x + i * K + b * 8);
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    } else {                             // blocks: dequantize one row's block, use it at once
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) {
        __m256 wv[V];
        Blk<F>::load(w + j * rb, b, wv);
#pragma GCC unroll 4
        for (int c = 0; c < V; ++c) {
#pragma GCC unroll 8
          for (int i = 0; i < MB; ++i)
            acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * K + (b * V + c) * 8), wv[c], acc[i][j]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MB; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      float s = hsum(acc[i][j]);
      if (bias) s += bias[j];
      float* dst = y + i * N + j;
      *dst = accumulate ? *dst + s : s;
    }
}

template <int F>
void dequant_rows(const uint8_t* w, int64_t rb, int64_t rows, int64_t K, float* out) {
  constexpr int V = Blk<F>::vecs;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < K / Blk<F>::size; ++b) {
      __m256 v[V];
      Blk<F>::load(w + r * rb, b, v);
      for (int c = 0; c < V; ++c) _mm256_storeu_ps(out + r * K + (b * V + c) * 8, v[c]);
    }
}

template <int F, int NB, int MB>
inline void tile_rows(const float* x, int64_t K, const uint8_t* w, int64_t rb, float* y, int64_t N,
                      const float* bias, bool acc) {
  tile<F, MB, NB>(x, K, w, rb, y, N, bias, acc);
}

// All M tokens against NB rows, in groups of at most MB_MAX tokens of near-equal size.
template <int F, int NB>
inline void tiles_m(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t rb, float* y, int64_t N,
                    const float* bias, bool acc) {
  constexpr int64_t MB_MAX = 12 / NB < 6 ? 12 / NB : 6;
  const int64_t groups = (M + MB_MAX - 1) / MB_MAX;
  int64_t m = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t size = (M - m) / (groups - g);
    const float* xg = x + m * K;
    float* yg = y + m * N;
    switch (size) {
      case 1: tile_rows<F, NB, 1>(xg, K, w, rb, yg, N, bias, acc); break;
      case 2: tile_rows<F, NB, 2>(xg, K, w, rb, yg, N, bias, acc); break;
      case 3: tile_rows<F, NB, 3>(xg, K, w, rb, yg, N, bias, acc); break;
      case 4: tile_rows<F, NB, 4>(xg, K, w, rb, yg, N, bias, acc); break;
      case 5: if constexpr (MB_MAX >= 5) tile_rows<F, NB, 5>(xg, K, w, rb, yg, N, bias, acc); break;
      case 6: if constexpr (MB_MAX >= 6) tile_rows<F, NB, 6>(xg, K, w, rb, yg, N, bias, acc); break;
      default: break;
    }
    m += size;
  }
}

// One token: 8 output rows at a time with on-the-fly dequantization (memory-bound regime).
// Several tokens: 2 output rows are dequantized once into a per-thread buffer, then every group of
// up to 6 tokens runs over the buffer (compute-bound regime).  Both give the same bits.
// Output rows are split in tiles of NB rows over the threads; a tile's rows are dequantized once
// into a per-thread fp32 buffer (exact values), then every group of tokens runs over the buffer.
template <int F, int NB>
void linear_tiles(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, const float* bias,
                  float* y, bool acc) {
  const int64_t rb = static_cast<int64_t>(K / Blk<F>::size) * Blk<F>::bytes;
  const int64_t tiles = (N + NB - 1) / NB;
#pragma omp parallel
  {
    float* buf = F == F32 ? nullptr : static_cast<float*>(std::aligned_alloc(64, ((NB * K * 4 + 63) / 64) * 64));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t n0 = t * NB, nb = N - n0 < NB ? N - n0 : NB;
      const float* bb = bias ? bias + n0 : nullptr;
      const uint8_t* src = w + n0 * rb;
      int64_t stride = rb;
      if (F != F32) {
        dequant_rows<F>(src, rb, nb, K, buf);
        src = reinterpret_cast<const uint8_t*>(buf);
        stride = K * 4;
      }
      if (nb == NB) {
        tiles_m<F32, NB>(x, M, K, src, stride, y + n0, N, bb, acc);
      } else {
        for (int64_t r = 0; r < nb; ++r)
          tiles_m<F32, 1>(x, M, K, src + r * stride, stride, y + n0 + r, N, bb ? bb + r : nullptr, acc);
      }
    }
    std::free(buf);
  }
}

// One token: 8 independent accumulator chains per tile; several tokens: 3 rows x up to 4 tokens.
template <int F>
void linear_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, const float* bias,
                 float* y, bool acc) {
  if (M == 1 && M1_FUSED) {
    constexpr int NB = M1_ROWS;
    const int64_t rb = static_cast<int64_t>(K / Blk<F>::size) * Blk<F>::bytes, tiles = N / NB;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; ++t)
      tile<F, 1, NB>(x, K, w + t * NB * rb, rb, y + t * NB, N, bias ? bias + t * NB : nullptr, acc);
    for (int64_t n = tiles * NB; n < N; ++n) tile<F, 1, 1>(x, K, w + n * rb, rb, y + n, N, bias ? bias + n : nullptr, acc);
  } else if (M == 1) {
    linear_tiles<F, M1_ROWS>(x, M, K, w, N, bias, y, acc);
  } else {
    linear_tiles<F, MT_ROWS>(x, M, K, w, N, bias, y, acc);
  }
}

// Cephes-style exp for 8 lanes (relative error ~1e-7); inputs clamped to [-87.3, 88.7].
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365478515625f)), _mm256_set1_ps(88.72283935546875f));
  __m256 fx = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, z), x), _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

inline __m256 tail_mask(int64_t valid) {  // lanes < valid set
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)), idx));
}

inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t k = 0; k < n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
  return hsum(acc);
}

inline float hmax(__m256 v) {  // max is exact: order does not matter
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_max_ss(a, _mm_shuffle_ps(a, a, 1)));
}

// Dot products of q [D] with 8 consecutive rows of k (stride D): 8 lane-wise FMA chains over D,
// then one fixed hadd tree that leaves score r in lane r.
inline __m256 scores8(const float* q, const float* k, int64_t D) {
  __m256 a[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) a[r] = _mm256_setzero_ps();
  for (int64_t c = 0; c < D; c += 8) {
    const __m256 qv = _mm256_loadu_ps(q + c);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + r * D + c), a[r]);
  }
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

inline void rms_row(const float* x, const float* w, int64_t K, float eps, float* y) {
  const float r = 1.0f / std::sqrt(dot(x, x, K) / static_cast<float>(K) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  for (int64_t k = 0; k < K; k += 8)
    _mm256_storeu_ps(y + k, _mm256_mul_ps(_mm256_loadu_ps(w + k), _mm256_mul_ps(_mm256_loadu_ps(x + k), rv)));
}

// Hugging Face rotate-half RoPE: out = x * cos + rotate_half(x) * sin, rotate_half = (-x2, x1).
inline void rope_row(const float* x, const float* cs, const float* sn, int64_t D, float* out) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < half; ++d) {
    out[d] = x[d] * cs[d] - x[d + half] * sn[d];
    out[d + half] = x[d + half] * cs[d + half] + x[d] * sn[d + half];
  }
}

}  // namespace

extern "C" {

int ss_abi_version() { return 1; }

int64_t ss_row_bytes(int fmt, int64_t K) {
  switch (fmt) {
    case F32: return K * 4;
    case F16: return K * 2;
    case Q8_0: return K / 32 * 34;
    case Q4_1: return K / 32 * 20;
    default: return -1;
  }
}

// x: [M, K] fp32; w: [N, row_bytes(fmt, K)]; bias: [N] or null; y: [M, N] (read when accumulate).
void ss_linear(const float* x, int64_t M, int64_t K, const uint8_t* w, int fmt, int64_t N, const float* bias,
               float* y, int accumulate) {
  switch (fmt) {
    case F32: linear_impl<F32>(x, M, K, w, N, bias, y, accumulate); break;
    case F16: linear_impl<F16>(x, M, K, w, N, bias, y, accumulate); break;
    case Q8_0: linear_impl<Q8_0>(x, M, K, w, N, bias, y, accumulate); break;
    case Q4_1: linear_impl<Q4_1>(x, M, K, w, N, bias, y, accumulate); break;
    default: break;
  }
}

// Gather and dequantize rows: tokens [n] int64 -> out [n, K] fp32.
void ss_embed(const int64_t* tokens, int64_t n, const uint8_t* w, int fmt, int64_t K, float* out) {
  const int64_t rb = ss_row_bytes(fmt, K);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* row = w + tokens[i] * rb;
    switch (fmt) {
      case F32: dequant_rows<F32>(row, rb, 1, K, out + i * K); break;
      case F16: dequant_rows<F16>(row, rb, 1, K, out + i * K); break;
      case Q8_0: dequant_rows<Q8_0>(row, rb, 1, K, out + i * K); break;
      case Q4_1: dequant_rows<Q4_1>(row, rb, 1, K, out + i * K); break;
      default: break;
    }
  }
}

// x, y: [M, K]; w: [K].  y = w * (x * 1/sqrt(mean(x^2) + eps)).
void ss_rmsnorm(const float* x, const float* w, int64_t M, int64_t K, float eps, float* y) {
  for (int64_t m = 0; m < M; ++m) rms_row(x + m * K, w + 0, K, eps, y + m * K);
}

// gu: [M, 2I] (gate | up) -> out: [M, I] = silu(gate) * up.
void ss_silu_mul(const float* gu, int64_t M, int64_t I, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; i += 8) {
      const __m256 g = _mm256_loadu_ps(gu + m * 2 * I + i), u = _mm256_loadu_ps(gu + m * 2 * I + I + i);
      const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g))));
      _mm256_storeu_ps(out + m * I + i, _mm256_mul_ps(s, u));
    }
}

// qkv: [B*T, (H + 2*Hkv) * D]; cos, sin: [positions, D]; rows: [B]; pos: [B*T];
// q_norm, k_norm: [D] or null (Qwen3); q_out: [B*T, H, D]; kc, vc: [R, Hkv, C, D] (this layer).
// Normalises (optionally) and rotates q and k, writes k and v into the cache at (row, pos).
void ss_rope_cache(const float* qkv, const float* cos, const float* sin, const int64_t* rows, const int64_t* pos,
                   int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t C, int64_t D, const float* q_norm,
                   const float* k_norm, float eps, float* q_out, float* kc, float* vc) {
  const int64_t W = (H + 2 * Hkv) * D;
  float tmp[1024];
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t p = pos[bt], row = rows[bt / T];
    const float *cs = cos + p * D, *sn = sin + p * D, *src = qkv + bt * W;
    for (int64_t h = 0; h < H; ++h) {
      const float* v = src + h * D;
      if (q_norm) { rms_row(v, q_norm, D, eps, tmp); v = tmp; }
      rope_row(v, cs, sn, D, q_out + (bt * H + h) * D);
    }
    for (int64_t h = 0; h < Hkv; ++h) {
      const float* v = src + (H + h) * D;
      if (k_norm) { rms_row(v, k_norm, D, eps, tmp); v = tmp; }
      const int64_t at = ((row * Hkv + h) * C + p) * D;
      rope_row(v, cs, sn, D, kc + at);
      std::memcpy(vc + at, src + (H + Hkv + h) * D, D * sizeof(float));
    }
  }
}

// q: [B*T, H, D]; kc, vc: [R, Hkv, C, D]; rows: [B]; pos: [B*T]; out: [B*T, H, D].
// Token (b, t) attends to cache positions 0..pos[b, t] of row rows[b].
// Work is split by (row, kv head, group of up to QG query heads sharing that kv head), so a key or
// value block loaded for one query is reused from L1 by the others.  Each query's result is the
// same sequence of operations whatever group it is in: scores by scores8, softmax with a lane-wise
// sum, then o += p_j v_j in key order (o parked in memory between key chunks: exact).
void ss_attention(const float* q, const float* kc, const float* vc, const int64_t* rows, const int64_t* pos,
                  int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t C, int64_t D, float scale, float* out) {
  const int64_t G = H / Hkv, per_head = T * G;
  const int64_t QG = per_head >= 8 ? 4 : 1;
  const int64_t chunks = (per_head + QG - 1) / QG, tasks = B * Hkv * chunks;
  const int64_t stride = ((C + 15) / 16) * 16;           // score row, room for a full last group
  constexpr int64_t KEY_CHUNK = 64;
#pragma omp parallel
  {
    float* s = static_cast<float*>(std::aligned_alloc(64, QG * stride * 4));
    float* obuf = static_cast<float*>(std::aligned_alloc(64, ((QG * D * 4 + 63) / 64) * 64));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t chunk = task % chunks, hk = (task / chunks) % Hkv, b = task / (chunks * Hkv);
      const int64_t q0 = chunk * QG, nq = per_head - q0 < QG ? per_head - q0 : QG;
      const int64_t base = (rows[b] * Hkv + hk) * C * D;
      const float *kb = kc + base, *vb = vc + base;
      const float* qv[4];
      float* ov[4];
      int64_t n[4], nmax = 0;
      float inv[4];
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = (q0 + i) / G, h = hk * G + (q0 + i) % G, bt = b * T + t;
        qv[i] = q + (bt * H + h) * D;
        ov[i] = out + (bt * H + h) * D;
        n[i] = pos[bt] + 1;
        nmax = n[i] > nmax ? n[i] : nmax;
      }
      // 1. scores, 8 keys at a time (a group may read cache slots past n: the capacity is a
      //    multiple of 8; those lanes are masked).  A score's bits depend only on q and k_j.
      __m256 mxv[4];
      for (int64_t i = 0; i < nq; ++i) mxv[i] = _mm256_set1_ps(-INFINITY);
      for (int64_t j = 0; j < nmax; j += 8) {
        for (int64_t i = 0; i < nq; ++i) {
          if (j >= n[i]) continue;
          __m256 sc = _mm256_mul_ps(scores8(qv[i], kb + j * D, D), _mm256_set1_ps(scale));
          if (n[i] - j < 8) sc = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, tail_mask(n[i] - j));
          _mm256_storeu_ps(s + i * stride + j, sc);
          mxv[i] = _mm256_max_ps(mxv[i], sc);
        }
      }
      // 2. p_j = exp(s_j - max), summed lane-wise (key j in lane j % 8; padding adds exact zeros)
      for (int64_t i = 0; i < nq; ++i) {
        const __m256 mv = _mm256_set1_ps(hmax(mxv[i]));
        __m256 sum = _mm256_setzero_ps();
        float* si = s + i * stride;
        for (int64_t j = 0; j < n[i]; j += 8) {
          __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(si + j), mv));
          if (n[i] - j < 8) e = _mm256_and_ps(e, tail_mask(n[i] - j));
          _mm256_storeu_ps(si + j, e);
          sum = _mm256_add_ps(sum, e);
        }
        inv[i] = 1.0f / hsum(sum);
      }
      // 3. o = sum_j p_j v_j in key order, in chunks of keys shared by the group's queries
      const int64_t V = D / 8;
      for (int64_t i = 0; i < nq * D; i += 8) _mm256_storeu_ps(obuf + i, _mm256_setzero_ps());
      for (int64_t j0 = 0; j0 < nmax; j0 += KEY_CHUNK) {
        for (int64_t i = 0; i < nq; ++i) {
          const int64_t j1 = j0 + KEY_CHUNK < n[i] ? j0 + KEY_CHUNK : n[i];
          if (j0 >= j1) continue;
          __m256 o[32];
          float* oi = obuf + i * D;
          const float* si = s + i * stride;
          for (int64_t c = 0; c < V; ++c) o[c] = _mm256_loadu_ps(oi + 8 * c);
          for (int64_t j = j0; j < j1; ++j) {
            const __m256 pj = _mm256_set1_ps(si[j]);
            for (int64_t c = 0; c < V; ++c) o[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vb + j * D + 8 * c), o[c]);
          }
          for (int64_t c = 0; c < V; ++c) _mm256_storeu_ps(oi + 8 * c, o[c]);
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        const __m256 iv = _mm256_set1_ps(inv[i]);
        for (int64_t c = 0; c < V; ++c)
          _mm256_storeu_ps(ov[i] + 8 * c, _mm256_mul_ps(_mm256_loadu_ps(obuf + i * D + 8 * c), iv));
      }
    }
    std::free(s);
    std::free(obuf);
  }
}

}  // extern "C"
