// Linear layers and embedding rows over weights kept in their storage blocks (see simd.h).

#include "blocks.h"
#include "exports.h"

namespace ss {
namespace {

// Tile shapes, chosen by A/B timing on the development machine (any shape gives the same bits).
constexpr int M1_ROWS = 2;   // output rows per tile when one token: dequantized straight into the FMAs
constexpr int MT_ROWS = 3;   // output rows per tile when several: dequantized once into a buffer

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

int ss_abi_version() { return static_cast<int>(ABI_VERSION); }

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
  if (fmt >= PACKED) {            // weights packed for int8 activations (q8.cpp)
    ss_q8_linear(x, M, K, w, fmt, N, bias, y, accumulate);
    return;
  }
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
  if (fmt >= PACKED) {
    ss_packed_rows(tokens, n, w, fmt, K, out);
    return;
  }
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
