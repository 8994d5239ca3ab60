// RoPE with the KV-cache write, RMSNorm, SiLU- and GELU-gating, residual adds and KV slot moves (see
// simd.h); attention is in attention.h.


#include "exports.h"
#include "simd.h"

namespace ss {
namespace {

// The KV cache's element types: fp32, or bf16 (simd.h: an fp32's top 16 bits, rounded to nearest
// even when written here; NaN kept NaN).  attention.h reads either back as fp32, exactly.
inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<bf16>((u >> 16) | 0x40u);   // NaN stays NaN
  return static_cast<bf16>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// A cache row of D values from fp32.
inline void store_row(float* dst, const float* src, int64_t D) { std::memcpy(dst, src, D * sizeof(float)); }
inline void store_row(bf16* dst, const float* src, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = to_bf16(src[d]);
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

template <class T>
void rope_cache(const float* qkv, const float* cos, const float* sin, const int64_t* rows, const int64_t* start,
                const int64_t* offsets, const int64_t* seq_of, const int64_t* pos, int64_t N, int64_t H,
                int64_t Hkv, int64_t C, int64_t D, const float* q_norm, const float* k_norm, float eps,
                float* q_out, T* kc, T* vc) {
  const int64_t W = (H + 2 * Hkv) * D;
  float tmp[1024], rot[1024];
  for (int64_t bt = 0; bt < N; ++bt) {
    const int64_t b = seq_of[bt], p = pos[bt], row = rows[b], slot = start[b] + bt - offsets[b];
    const float *cs = cos + p * D, *sn = sin + p * D, *src = qkv + bt * W;
    for (int64_t h = 0; h < H; ++h) {
      const float* v = src + h * D;
      if (q_norm) { rms_row(v, q_norm, D, eps, tmp); v = tmp; }
      rope_row(v, cs, sn, D, q_out + (bt * H + h) * D);
    }
    for (int64_t h = 0; h < Hkv; ++h) {
      const float* v = src + (H + h) * D;
      if (k_norm) { rms_row(v, k_norm, D, eps, tmp); v = tmp; }
      const int64_t at = ((row * Hkv + h) * C + slot) * D;
      rope_row(v, cs, sn, D, rot);
      store_row(kc + at, rot, D);
      store_row(vc + at, src + (H + Hkv + h) * D, D);
    }
  }
}

// out[m, i] = act(gate[m, i]) * up[m, i] for gu = [M, 2I] (gate | up), 8 elements at a time
// (I a multiple of 8), split over the threads when the work is large enough to pay for waking
// them; every element is the same operations wherever it is computed.
template <class Act>
void gated(const float* gu, int64_t M, int64_t I, float* out, Act act) {
  const int64_t per_row = I / 8;
#pragma omp parallel for schedule(static) num_threads(threads()) if (M * I >= 4096)
  for (int64_t k = 0; k < M * per_row; ++k) {
    const int64_t m = k / per_row, i = 8 * (k % per_row);
    const __m256 g = _mm256_loadu_ps(gu + m * 2 * I + i), u = _mm256_loadu_ps(gu + m * 2 * I + I + i);
    _mm256_storeu_ps(out + m * I + i, _mm256_mul_ps(act(g), u));
  }
}

}  // namespace
}  // namespace ss

using namespace ss;

extern "C" {

// x, y: [M, K]; w: [K].  y = w * (x * 1/sqrt(mean(x^2) + eps)).
void ss_rmsnorm(const float* x, const float* w, int64_t M, int64_t K, float eps, float* y) {
  for (int64_t m = 0; m < M; ++m) rms_row(x + m * K, w + 0, K, eps, y + m * K);
}

// gu: [M, 2I] (gate | up) -> out: [M, I] = silu(gate) * up.
void ss_silu_mul(const float* gu, int64_t M, int64_t I, float* out) {
  gated(gu, M, I, out, [](__m256 g) {
    return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
  });
}

// gu: [M, 2I] (gate | up) -> out: [M, I] = gelu_tanh(gate) * up, with
// gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) (Gemma's MLP), element by element,
// tanh(y) = sign(y) (1 - e) / (1 + e) with e = exp8(-2 |y|) (no cancellation near 0 worth a bit of
// the result: 1 + tanh is what the gate uses).
void ss_gelu_tanh_mul(const float* gu, int64_t M, int64_t I, float* out) {
  gated(gu, M, I, out, [](__m256 g) {
    const __m256 c = _mm256_set1_ps(0.7978845608028654f), a = _mm256_set1_ps(0.044715f);
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(a, g), g), g);
    const __m256 y = _mm256_mul_ps(c, _mm256_add_ps(g, cube));
    const __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, y)));
    const __m256 t = _mm256_or_ps(_mm256_and_ps(sign, y),
                                  _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e)));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g), _mm256_add_ps(one, t));
  });
}

// x += y, [n] (a residual add after a post-norm).
void ss_add(float* x, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) x[i] += y[i];
}

// A cache [L, R, Hkv, C, D] of elem-byte entries (either kind): in row `row`, for every layer and
// kv head, slot dst[i] takes slot src[i]'s entry, i = 0 .. n-1 in order (an accepted tree path moved
// together; KVCache.compact).
void ss_move_slots(void* cache, int64_t L, int64_t R, int64_t Hkv, int64_t C, int64_t D, int64_t elem, int64_t row,
                   const int64_t* dst, const int64_t* src, int64_t n) {
  char* base = static_cast<char*>(cache);
  const int64_t entry = D * elem;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < Hkv; ++h) {
      char* slots = base + (((l * R + row) * Hkv + h) * C) * entry;
      for (int64_t i = 0; i < n; ++i) std::memmove(slots + dst[i] * entry, slots + src[i] * entry, entry);
    }
}

// x *= s, [n] (Gemma's scaled embeddings).
void ss_scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

// A pass is *ragged*: N tokens in a flat list, sequence b owning tokens offsets[b] .. offsets[b+1]-1
// (seq_of[i] is token i's sequence).  Token i = offsets[b] + t of sequence b is written to cache
// slot start[b] + t of row rows[b].
//
// qkv: [N, (H + 2*Hkv) * D]; cos, sin: [positions, D]; rows, start: [B]; offsets: [B+1];
// seq_of, pos: [N] (pos: rotary positions); q_norm, k_norm: [D] or null (Qwen3); q_out: [N, H, D];
// kc, vc: [R, Hkv, C, D] (this layer) of fp32 (kv 0) or bf16 (kv 1).  Normalises (optionally) and
// rotates q and k by pos, writes each token's k and v into the cache at its slot.
void ss_rope_cache(const float* qkv, const float* cos, const float* sin, const int64_t* rows, const int64_t* start,
                   const int64_t* offsets, const int64_t* seq_of, const int64_t* pos, int64_t N, int64_t H,
                   int64_t Hkv, int64_t C, int64_t D, const float* q_norm, const float* k_norm, float eps,
                   float* q_out, void* kc, void* vc, int64_t kv) {
  if (kv) rope_cache(qkv, cos, sin, rows, start, offsets, seq_of, pos, N, H, Hkv, C, D, q_norm, k_norm, eps, q_out,
                     static_cast<bf16*>(kc), static_cast<bf16*>(vc));
  else rope_cache(qkv, cos, sin, rows, start, offsets, seq_of, pos, N, H, Hkv, C, D, q_norm, k_norm, eps, q_out,
                  static_cast<float*>(kc), static_cast<float*>(vc));
}

}  // extern "C"
