// Attention on 512-bit registers (attention.h, SS_ATT_PATH 1): compiled with AVX-512F and called only
// where the CPU has it (attention.cpp chooses).  With SS_ATT_STUB (a compiler without the flags) the
// entry points do nothing and say the path was not compiled, so it is never chosen.

#include <cstdint>

#include "exports.h"

#ifdef SS_ATT_STUB
extern "C" {
void ss_attention_avx512(const float*, const void*, const void*, const int64_t*, const int64_t*, const int64_t*,
                         const int64_t*, const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, float, int64_t,
                         float*, int64_t, int) {}
double ss_attention_peak_avx512(int64_t) { return 1e9; }
int ss_attention_compiled_avx512() { return 0; }
}
#else
#define SS_ATT_PATH 1
#include "attention.h"

extern "C" {

void ss_attention_avx512(const float* q, const void* kc, const void* vc, const int64_t* rows, const int64_t* start,
                         const int64_t* offsets, const int64_t* pos, const int64_t* parent, int64_t B, int64_t H,
                         int64_t Hkv, int64_t C, int64_t D, float scale, int64_t window, float* out, int64_t kv,
                         int threads) {
  ss::attention_any(q, kc, vc, rows, start, offsets, pos, parent, B, H, Hkv, C, D, scale, window, out, kv, threads);
}

// Seconds one thread takes for `iters` rounds of 8 independent 16-lane FMA chains (twice the work of
// attention.cpp's 256-bit rounds: compare against twice as many of those).
double ss_attention_peak_avx512(int64_t iters) {
  __m512 a[8];
  for (int r = 0; r < 8; ++r) a[r] = _mm512_set1_ps(static_cast<float>(r));
  __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
  const double t0 = omp_get_wtime();
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) a[r] = _mm512_fmadd_ps(a[r], m, c);
    __asm__ volatile("" : "+v"(m));
  }
  const double t = omp_get_wtime() - t0;
  volatile float sink = _mm512_reduce_add_ps(a[0]);
  (void)sink;
  return t;
}

int ss_attention_compiled_avx512() { return 1; }

}  // extern "C"
#endif  // SS_ATT_STUB
