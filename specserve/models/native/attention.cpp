// Attention (attention.h): the AVX2 path compiled here, the AVX-512 path in attention_avx512.cpp, and
// the choice between them at run time.  Both give the same bits (attention.h), so the choice changes
// speed only.

#define SS_ATT_PATH 0
#include "attention.h"
#include "exports.h"


namespace ss {
namespace {

// Seconds one thread takes for `iters` rounds of 8 independent 8-lane FMA chains (AVX2).
double fma_seconds_avx2(int64_t iters) {
  __m256 a[8];
  for (int r = 0; r < 8; ++r) a[r] = _mm256_set1_ps(static_cast<float>(r));
  __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
  const double t0 = omp_get_wtime();
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(a[r], m, c);
    __asm__ volatile("" : "+x"(m));
  }
  const double t = omp_get_wtime() - t0;
  volatile float sink = hsum(a[0]);
  (void)sink;
  return t;
}

bool path_runs(int p) {
  __builtin_cpu_init();
  if (p == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return p == 1 && ss_attention_compiled_avx512() && __builtin_cpu_supports("avx512f");
}

// AVX-512 where the CPU runs a 512-bit FMA at (nearly) twice the work of a 256-bit one per unit of
// time (some split each 512-bit operation in two halves; there the AVX2 path is kept), measured once.
int best_path() {
  static const int best = [] {
    if (!path_runs(1)) return 0;
    double t256 = 1e9, t512 = 1e9;
    for (int k = 0; k < 3; ++k) {
      const double a = fma_seconds_avx2(1 << 16), b = ss_attention_peak_avx512(1 << 15);   // the same work
      t256 = a < t256 ? a : t256;
      t512 = b < t512 ? b : t512;
    }
    return t512 * 1.5 < t256 ? 1 : 0;
  }();
  return best;
}
int g_att_path = -1;   // -1: not chosen yet (the best the CPU runs)

}  // namespace
}  // namespace ss

using namespace ss;

extern "C" {

// Whether attention path p (0 AVX2, 1 AVX-512) runs on this CPU.
int ss_attention_path_runs(int p) { return path_runs(p) ? 1 : 0; }

// Use path p for later attention calls (-1: the best this CPU runs); returns the path now in use, or
// -1 (changing nothing) when this CPU cannot run p.
int ss_attention_set_path(int p) {
  if (p < 0) p = best_path();
  if (!path_runs(p)) return -1;
  g_att_path = p;
  return p;
}

int ss_attention_path() { return g_att_path < 0 ? best_path() : g_att_path; }

// q: [N, H, D]; kc, vc: [R, Hkv, C, D] of fp32 (kv 0) or bf16 (kv 1); rows, start: [B]; offsets: [B+1]
// (a ragged pass: sequence b owns tokens offsets[b] .. offsets[b+1]-1, written at slots start[b]..);
// pos: [N] rotary positions; parent: [N] index of each token's parent among its sequence's tokens
// (-1 for a root), or null for chains; window: a query sees only keys at positions > its own - window
// (virtual index = position; 0: every key); out: [N, H, D].
// Token t of sequence b attends to the cached prefix (slots 0..start[b]-1 of row rows[b]) and to its
// ancestors in the pass and itself (slots start[b] + ancestor index), taken in virtual order (see
// KeyPath in attention.h).  For a chain that is slots 0..start[b]+t.
void ss_attention(const float* q, const void* kc, const void* vc, const int64_t* rows, const int64_t* start,
                  const int64_t* offsets, const int64_t* pos, const int64_t* parent, int64_t B, int64_t H,
                  int64_t Hkv, int64_t C, int64_t D, float scale, int64_t window, float* out, int64_t kv) {
  if (ss_attention_path() == 1)
    ss_attention_avx512(q, kc, vc, rows, start, offsets, pos, parent, B, H, Hkv, C, D, scale, window, out, kv,
                        threads());
  else
    attention_any(q, kc, vc, rows, start, offsets, pos, parent, B, H, Hkv, C, D, scale, window, out, kv, threads());
}

}  // extern "C"
