// specserve native CPU kernels (simd.h: shared helpers; linear.cpp; layer_ops.cpp; q8.h: the int8-activation
// linears): AVX2 + FMA + F16C, fp32 or int8 activations, OpenMP over independent work.
//
// Every kernel computes each output element with one fixed sequence of floating-point operations
// that depends only on that element's inputs, never on how many rows, tokens or cache slots share
// the call, nor on how the work is split between threads.  That makes the runtime batch-invariant
// by construction: a token scored alone in a decoding pass and inside a (k+1)-token verification
// pass, alone or batched, gets bit-identical logits.
//
//   linear:    y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) (+ y[m, n] when accumulating).  (With int8
//              activations: q8.h, which states its own invariance argument.)
//              w is stored as GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) or as F16/F32 rows and dequantized
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
//
// The helpers below have internal linkage (an unnamed namespace): a source compiled with extra
// instruction sets (attention_avx512.cpp) gets its own copies, so the linker can never hand an AVX2
// source a copy built with AVX-512 instructions.

#pragma once

#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace ss {

// Threads each parallel region uses (0: OpenMP's default).  Threads only decide which output
// elements are computed together, never how one is computed, so this changes speed, not bits.
inline int g_threads = 0;

namespace {
inline int threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }
}  // namespace

enum Fmt : int { F32 = 0, F16 = 1, Q8_0 = 2, Q4_1 = 3, Q4_0 = 4, Q5_0 = 5, Q5_1 = 6, Q4_K = 7, Q5_K = 8, Q6_K = 9 };
// A weight packed for int8 activations (q8.h) has format PACKED + the GGUF format it came from.
constexpr int PACKED = 16;
// A fused weight (QKV) whose parts are packed in different formats: MIXED_HEADER bytes of int64
// {parts, then per part: packed format, rows (a multiple of 8), byte offset of its packed data from
// the weight's start}, then the parts' packed data.
constexpr int MIXED = 64;
constexpr int MIXED_HEADER = 128;
// The library's interface version (ss_abi_version, SsPass::version; ABI_VERSION in abi.py): bumped
// whenever an exported function's arguments or the structures ss_forward reads change.
constexpr int64_t ABI_VERSION = 13;

// The cache's bf16 element: an fp32's top 16 bits (layer_ops.cpp writes them, attention.h reads them).
using bf16 = uint16_t;

namespace {

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

}  // namespace
}  // namespace ss
