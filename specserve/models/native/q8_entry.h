// One instruction-set path's entry points (SS_Q8_PATH, SS_Q8_ENTRY, SS_Q8_PEAK and, for the optional
// paths, SS_Q8_COMPILED defined by the including file): y [M, N] = x W^T for activations already
// quantized (see q8.h) and a packed weight of format fmt (y [M, ldy], its first N columns), and the
// path's multiply-add ceiling.
// With SS_Q8_STUB (an optional path the compiler cannot build; compiled without its flags) the
// entry points do nothing and SS_Q8_COMPILED says 0, so the path is never chosen.

#include <cstdint>

#include "exports.h"

#ifdef SS_Q8_STUB
extern "C" {
void SS_Q8_ENTRY(const int8_t*, const float*, const float*, const int32_t*, int64_t, int64_t, const uint8_t*, int,
                 int64_t, int64_t, const float*, float*, int, int) {}
double SS_Q8_PEAK(int64_t, int, int32_t*) { return 0.0; }
int SS_Q8_COMPILED() { return 0; }
}
#else
#include "q8.h"
#if SS_Q8_PATH >= 3
#include "q8_wide.h"
#endif

#ifdef SS_Q8_COMPILED
extern "C" int SS_Q8_COMPILED() { return 1; }
#endif

extern "C" void SS_Q8_ENTRY(const int8_t* q, const float* d, const float* sx, const int32_t* hs, int64_t M,
                            int64_t K, const uint8_t* w, int fmt, int64_t N, int64_t ldy, const float* bias,
                            float* y, int accumulate, int threads) {
  const Act a{q, d, sx, hs, K, K / 32};
  // the packed formats: 16 + the GGUF format's id (simd.h)
  with_format(fmt - 16, [&](auto p) {
#if SS_Q8_PATH == 4   // up to 2 tokens (memory-bound): one weight stream per thread reads fastest
    if (M <= 2) {
      packed_linear<decltype(p)>(a, M, w, N, ldy, bias, y, accumulate != 0, threads);
    } else {
      thread_local std::vector<uint8_t> runs;
      packed_linear_wide<decltype(p)>(a, block_major<decltype(p)>(a, M, runs), M, w, N, ldy, bias, y, accumulate != 0, threads);
    }
#elif SS_Q8_PATH == 3
    packed_linear_wide<decltype(p)>(a, a, M, w, N, ldy, bias, y, accumulate != 0, threads);
#else
    packed_linear<decltype(p)>(a, M, w, N, ldy, bias, y, accumulate != 0, threads);
#endif
  });
}

// Seconds for every thread to run `iters` rounds of 8 independent chains of this path's 32-multiply-add
// integer step (dot4: 8 lanes x 4 byte products), each chain with its own weights and the activations
// hidden from the optimizer every round (so no product can be hoisted out of the loop), nothing
// read from memory: the path's int8 multiply-add ceiling.  sink: [threads].
extern "C" double SS_Q8_PEAK(int64_t iters, int threads, int32_t* sink) {
  const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads)
  {
    __m256i a[8], w[8];
    for (int r = 0; r < 8; ++r) {
      a[r] = _mm256_set1_epi32(r);
      w[r] = _mm256_set1_epi8(static_cast<char>(r + 1));
    }
#if SS_Q8_PATH >= 3     // 512-bit steps, twice the work each: half the rounds
    __m512i z[8], zw[8];
    for (int r = 0; r < 8; ++r) {
      z[r] = _mm512_set1_epi32(r);
      zw[r] = _mm512_set1_epi8(static_cast<char>(r + 1));
    }
    __m512i zy = _mm512_set1_epi8(-2);
    for (int64_t it = 0; it < iters / 2; ++it) {
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) z[r] = _mm512_dpbusd_epi32(z[r], zw[r], zy);
      __asm__ volatile("" : "+v"(zy));
    }
    for (int r = 0; r < 8; ++r) a[r] = _mm256_add_epi32(a[r], _mm512_castsi512_si256(z[r]));
#else
    __m256i y = _mm256_set1_epi8(-2);
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) a[r] = dot4<PQ4_1>(a[r], w[r], y);
      __asm__ volatile("" : "+x"(y));
    }
#endif
    __m256i t = a[0];
    for (int r = 1; r < 8; ++r) t = _mm256_add_epi32(t, a[r]);
    sink[omp_get_thread_num()] = _mm256_extract_epi32(t, 0);
  }
  return omp_get_wtime() - t0;
}
#endif  // SS_Q8_STUB
