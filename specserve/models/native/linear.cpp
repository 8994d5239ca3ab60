// Linear layers and embedding rows over weights kept in their storage blocks (see simd.h).

#include "simd.h"

namespace ss {
namespace {

// Tile shapes, chosen by A/B timing on the development machine (any shape gives the same bits).
constexpr int M1_ROWS = 2;   // output rows per tile when one token: dequantized straight into the FMAs
constexpr int MT_ROWS = 3;   // output rows per tile when several: dequantized once into a buffer

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

// Q4_0: {fp16 d; uint8 qs[16]}; nibbles as Q4_1; w = d * (q - 8).
template <> struct Blk<Q4_0> {
  static constexpr int size = 32, vecs = 4, bytes = 18;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 18;
    const __m256 d = _mm256_set1_ps(h2f(p));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);
    out[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
    out[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
    out[2] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
    out[3] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
  }
};

// The 5th bits of a Q5_0 / Q5_1 block's elements 8c .. 8c+7 (bit j of the 32-bit qh is element j's),
// shifted to bit 4: [8] int32.
inline __m256i q5_high(uint32_t qh, int c) {
  const __m256i shifts = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i bits = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qh >> (8 * c))), shifts);
  return _mm256_slli_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(1)), 4);
}

// The 4-bit parts of a 32-element block's nibbles (element j < 16: low nibble of qs[j], j >= 16: high
// nibble of qs[j - 16]) for elements 8c .. 8c+7: [8] int32.
inline __m256i nibbles32(const uint8_t* qs, int c) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * (c & 1)));
  const __m128i v = c < 2 ? raw : _mm_srli_epi16(raw, 4);
  return _mm256_cvtepu8_epi32(_mm_and_si128(v, _mm_set1_epi8(0x0F)));
}

// Q5_0: {fp16 d; uint32 qh; uint8 qs[16]}; w = d * ((nibble | high bit << 4) - 16).
template <> struct Blk<Q5_0> {
  static constexpr int size = 32, vecs = 4, bytes = 22;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 22;
    const __m256 d = _mm256_set1_ps(h2f(p));
    uint32_t qh;
    std::memcpy(&qh, p + 2, 4);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_sub_epi32(_mm256_or_si256(nibbles32(p + 6, c), q5_high(qh, c)), _mm256_set1_epi32(16));
      out[c] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
    }
  }
};

// Q5_1: {fp16 d; fp16 m; uint32 qh; uint8 qs[16]}; w = d * (nibble | high bit << 4) + m (d * q exact).
template <> struct Blk<Q5_1> {
  static constexpr int size = 32, vecs = 4, bytes = 24;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 24;
    const __m256 d = _mm256_set1_ps(h2f(p)), m = _mm256_set1_ps(h2f(p + 2));
    uint32_t qh;
    std::memcpy(&qh, p + 4, 4);
    for (int c = 0; c < 4; ++c)
      out[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_or_si256(nibbles32(p + 8, c), q5_high(qh, c))), m);
  }
};

// K-quant scales: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void kscale(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// 8 bytes from p, as int32 lanes after (byte >> shift) & mask.
inline __m256i bytes8(const uint8_t* p, int shift, int mask) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu8_epi32(raw), shift), _mm256_set1_epi32(mask));
}

// Q4_K: 256 elements {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qs[128]}, 8 sub-blocks of 32:
// sub-block 2i holds the low nibbles of qs[32i .. 32i+31], 2i+1 the high ones;
// w = (d * sc) * q - dmin * mn.  (d * sc) * q is exact in fp32, so fma(d * sc, q, -dmin * mn) rounds
// once, exactly as gguf's numpy code does.
template <> struct Blk<Q4_K> {
  static constexpr int size = 256, vecs = 32, bytes = 144;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 144;
    const float d = h2f(p), dmin = h2f(p + 2);
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      kscale(p + 4, j, &sc, &mn);
      const __m256 ds = _mm256_set1_ps(d * static_cast<float>(sc)), dm = _mm256_set1_ps(-(dmin * static_cast<float>(mn)));
      const uint8_t* qs = p + 16 + 32 * (j / 2);
      for (int c = 0; c < 4; ++c)
        out[4 * j + c] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(bytes8(qs + 8 * c, 4 * (j & 1), 0x0F)), dm);
    }
  }
};

// Q5_K: {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}: as Q4_K, plus bit j of
// qh[l] as bit 4 of sub-block j's element l.
template <> struct Blk<Q5_K> {
  static constexpr int size = 256, vecs = 32, bytes = 176;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 176;
    const float d = h2f(p), dmin = h2f(p + 2);
    const uint8_t* qh = p + 16;
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      kscale(p + 4, j, &sc, &mn);
      const __m256 ds = _mm256_set1_ps(d * static_cast<float>(sc)), dm = _mm256_set1_ps(-(dmin * static_cast<float>(mn)));
      const uint8_t* qs = p + 48 + 32 * (j / 2);
      for (int c = 0; c < 4; ++c) {
        const __m256i q = _mm256_or_si256(bytes8(qs + 8 * c, 4 * (j & 1), 0x0F),
                                          _mm256_slli_epi32(bytes8(qh + 8 * c, j, 1), 4));
        out[4 * j + c] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(q), dm);
      }
    }
  }
};

// Q6_K: {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d}, two halves of 128 elements, each 4
// groups of 32: group g's element l is (4 bits of ql) | (2 bits of qh[l] at 2g) << 4, minus 32, where
// the 4 bits are the low (g < 2) or high nibble of ql[32 (g & 1) + l]; 16 scales over 16 elements each;
// w = (d * scale) * q, rounded once as in gguf's numpy code.
template <> struct Blk<Q6_K> {
  static constexpr int size = 256, vecs = 32, bytes = 210;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 210;
    const float d = h2f(p + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(p + 192);
    for (int h = 0; h < 2; ++h) {
      const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
      for (int g = 0; g < 4; ++g)
        for (int c = 0; c < 4; ++c) {
          const int l = 8 * c;
          const __m256i lo = bytes8(ql + 32 * (g & 1) + l, g < 2 ? 0 : 4, 0x0F);
          const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(bytes8(qh + l, 2 * g, 3), 4)),
                                             _mm256_set1_epi32(32));
          const float ds = d * static_cast<float>(scales[8 * h + 2 * g + c / 2]);
          out[16 * h + 4 * g + c] = _mm256_mul_ps(_mm256_set1_ps(ds), _mm256_cvtepi32_ps(q));
        }
    }
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
      case 1: tile<F, 1, NB>(xg, K, w, rb, yg, N, bias, acc); break;
      case 2: tile<F, 2, NB>(xg, K, w, rb, yg, N, bias, acc); break;
      case 3: tile<F, 3, NB>(xg, K, w, rb, yg, N, bias, acc); break;
      case 4: tile<F, 4, NB>(xg, K, w, rb, yg, N, bias, acc); break;
      case 5: if constexpr (MB_MAX >= 5) tile<F, 5, NB>(xg, K, w, rb, yg, N, bias, acc); break;
      case 6: if constexpr (MB_MAX >= 6) tile<F, 6, NB>(xg, K, w, rb, yg, N, bias, acc); break;
      default: break;
    }
    m += size;
  }
}

// Output rows are split in tiles of NB rows over the threads; a tile's rows are dequantized once
// into a per-thread fp32 buffer (exact values), then every group of tokens runs over the buffer.
template <int F, int NB>
void linear_tiles(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, const float* bias,
                  float* y, bool acc) {
  const int64_t rb = static_cast<int64_t>(K / Blk<F>::size) * Blk<F>::bytes;
  const int64_t tiles = (N + NB - 1) / NB;
#pragma omp parallel num_threads(threads())
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

// One token: tiles of M1_ROWS output rows dequantized on the fly, straight into the FMAs.
// Several tokens: tiles of MT_ROWS rows dequantized once into a buffer, then groups of up to 4
// tokens.  Both paths give every element the same operations, hence the same bits.
template <int F>
void linear_impl(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, const float* bias,
                 float* y, bool acc) {
  if (M == 1) {
    constexpr int NB = M1_ROWS;
    const int64_t rb = static_cast<int64_t>(K / Blk<F>::size) * Blk<F>::bytes, tiles = N / NB;
#pragma omp parallel for schedule(static) num_threads(threads())
    for (int64_t t = 0; t < tiles; ++t)
      tile<F, 1, NB>(x, K, w + t * NB * rb, rb, y + t * NB, N, bias ? bias + t * NB : nullptr, acc);
    for (int64_t n = tiles * NB; n < N; ++n) tile<F, 1, 1>(x, K, w + n * rb, rb, y + n, N, bias ? bias + n : nullptr, acc);
  } else {
    linear_tiles<F, MT_ROWS>(x, M, K, w, N, bias, y, acc);
  }
}

}  // namespace
}  // namespace ss

using namespace ss;

extern "C" {

int ss_abi_version() { return 8; }

// Seconds for every thread to run `iters` rounds of 12 independent 8-lane FMA chains: 96
// multiply-adds per round per thread, with nothing read from memory, i.e. the machine's fp32
// multiply-add ceiling as AVX2 + FMA can reach it.  sink: [threads] (keeps the work observable).
double ss_fma_peak(int64_t iters, float* sink) {
  const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads())
  {
    __m256 a[12];
    for (int r = 0; r < 12; ++r) a[r] = _mm256_set1_ps(1.0f + 0.01f * r);
    const __m256 m = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(0.0001f);
    for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
      for (int r = 0; r < 12; ++r) a[r] = _mm256_fmadd_ps(a[r], m, c);
    __m256 t = a[0];
    for (int r = 1; r < 12; ++r) t = _mm256_add_ps(t, a[r]);
    sink[omp_get_thread_num()] = hsum(t);
  }
  return omp_get_wtime() - t0;
}

// Threads for every later kernel call (0: OpenMP's default); returns the number now in use.
int ss_set_threads(int n) {
  g_threads = n;
  return threads();
}

// The number of threads the default (0) stands for, without changing the setting.
int ss_default_threads() { return omp_get_max_threads(); }

// End the calling thread's pool of OpenMP workers (OpenMP 5.0 omp_pause_resource_all).  Each
// thread that opens parallel regions owns a pool; once the pooled workers outnumber the cores,
// libgomp stops spinning at barriers and every region wakes its workers through the kernel, which
// makes a pass run from a second thread (a server's engine thread) far slower.  Returns 0 on success.
int ss_release_threads() { return omp_pause_resource_all(omp_pause_soft); }

int64_t ss_row_bytes(int fmt, int64_t K) {
  switch (fmt) {
    case F32: return K * 4;
    case F16: return K * 2;
    case Q8_0: return K / 32 * 34;
    case Q4_1: return K / 32 * 20;
    case Q4_0: return K / 32 * 18;
    case Q5_0: return K / 32 * 22;
    case Q5_1: return K / 32 * 24;
    case Q4_K: return K / 256 * 144;
    case Q5_K: return K / 256 * 176;
    case Q6_K: return K / 256 * 210;
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
    case Q4_0: linear_impl<Q4_0>(x, M, K, w, N, bias, y, accumulate); break;
    case Q5_0: linear_impl<Q5_0>(x, M, K, w, N, bias, y, accumulate); break;
    case Q5_1: linear_impl<Q5_1>(x, M, K, w, N, bias, y, accumulate); break;
    case Q4_K: linear_impl<Q4_K>(x, M, K, w, N, bias, y, accumulate); break;
    case Q5_K: linear_impl<Q5_K>(x, M, K, w, N, bias, y, accumulate); break;
    case Q6_K: linear_impl<Q6_K>(x, M, K, w, N, bias, y, accumulate); break;
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
      case Q4_0: dequant_rows<Q4_0>(row, rb, 1, K, out + i * K); break;
      case Q5_0: dequant_rows<Q5_0>(row, rb, 1, K, out + i * K); break;
      case Q5_1: dequant_rows<Q5_1>(row, rb, 1, K, out + i * K); break;
      case Q4_K: dequant_rows<Q4_K>(row, rb, 1, K, out + i * K); break;
      case Q5_K: dequant_rows<Q5_K>(row, rb, 1, K, out + i * K); break;
      case Q6_K: dequant_rows<Q6_K>(row, rb, 1, K, out + i * K); break;
      default: break;
    }
  }
}

}  // extern "C"
