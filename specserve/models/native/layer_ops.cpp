// Attention, RoPE with the KV-cache write, RMSNorm and SiLU-gating (see simd.h).

#include <type_traits>
#include <vector>

#include "simd.h"

namespace ss {
namespace {

// Queries sharing one kv head processed together by attention, so that each key and value block
// read from memory serves all of them: up to 16, for decoding, verification and prompt chunks alike
// (chosen by A/B timing: groups of 4 for runs under 16 tokens were no faster once o stays in
// registers); the grouping never changes a result's bits.
constexpr int64_t ATT_QG = 16;
// Keys ahead of the scores that the next keys and values are prefetched for (keys into L1, values,
// read after all the scores, into L2): the rows of one (sequence, kv head) are contiguous, and
// reaching past them (into the next head's rows or past the cache) only wastes a prefetch.
constexpr int64_t ATT_PREFETCH = 32;
constexpr int64_t KEY_CHUNK = 64;         // keys per run of o += p v, shared by a group's queries
constexpr int64_t MAX_HEAD_DIM = 256;     // (the Python side refuses larger heads)
// Longest path a tree pass may hold (the Python side refuses larger tree passes).
constexpr int64_t MAX_TREE_TOKENS = 256;

// The KV cache's element types: fp32, or bf16 (an fp32's top 16 bits, rounded to nearest even when
// written; NaN kept NaN).  Attention reads either back as fp32, exactly, and computes the same fp32
// operations over them, with AVX2 instructions only, so a bf16 cache gives the same bits on every
// instruction set (AVX512-BF16's dot products would round their pair sums differently).
using bf16 = uint16_t;

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

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

// Dot products of q [D] with 8 key rows: 8 lane-wise FMA chains over D, then one fixed hadd tree
// that leaves score r in lane r.  Score r is ((r0+r1)+(r2+r3)) + ((r4+r5)+(r6+r7)) of its own chain
// whatever r is, so its bits depend only on q and that key row, not on where the row is stored or
// which lane it lands in.  ``Rows`` maps r to a row pointer: consecutive rows, or gathered ones.
template <class Rows>
inline __m256 scores8(const float* q, const Rows& k, int64_t D) {
  __m256 a[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) a[r] = _mm256_setzero_ps();
  for (int64_t c = 0; c < D; c += 8) {
    const __m256 qv = _mm256_loadu_ps(q + c);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(qv, load8(k(r) + c), a[r]);
  }
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// The keys one query attends to, in *virtual* order: cache slots 0..start-1 (the cached prefix),
// then the slots of the query's ancestors in the pass, root first, and its own slot last.  For a
// chain the ancestors of token t are tokens 0..t, stored at slots start..start+t, so virtual index
// j is slot j; in a tree, virtual index start+i is the slot of the depth-i node on the query's path.
// Every reduction below runs over virtual indices, so a node's attention is the same sequence of
// operations as for the same path laid out as a chain.
template <class T>
struct KeyPath {
  const T* base;         // this (row, kv head)'s cache: [C, D]
  int64_t D, start;
  const int64_t* slot;   // absolute slots of the path (virtual start + i), or null for a chain
  inline const T* row(int64_t j) const { return base + (slot && j >= start ? slot[j - start] : j) * D; }
};
// o[8c .. 8(c+W)) += p_j v_j[8c .. 8(c+W)) for keys j = j0 .. j1-1 in order: W vectors of o kept in
// registers over the keys (one chain of FMAs per element in key order, as any split of o gives).
template <int W, class T>
inline void pv_run(float* o, const float* p, const KeyPath<T>& v, int64_t j0, int64_t j1, int64_t c) {
  __m256 acc[W];
#pragma GCC unroll 8
  for (int w = 0; w < W; ++w) acc[w] = _mm256_loadu_ps(o + 8 * (c + w));
  for (int64_t j = j0; j < j1; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const T* vj = v.row(j) + 8 * c;
#pragma GCC unroll 8
    for (int w = 0; w < W; ++w) acc[w] = _mm256_fmadd_ps(pj, load8(vj + 8 * w), acc[w]);
  }
#pragma GCC unroll 8
  for (int w = 0; w < W; ++w) _mm256_storeu_ps(o + 8 * (c + w), acc[w]);
}

// o[0 .. 8V) += p_j v_j for keys j = j0 .. j1-1 in order, 8 vectors of o at a time (held in registers).
template <class T>
inline void pv_keys(float* o, const float* p, const KeyPath<T>& v, int64_t j0, int64_t j1, int64_t V) {
  if (j0 >= j1) return;
  for (int64_t c = 0; c < V; c += 8) {
    switch (V - c < 8 ? V - c : 8) {
      case 8: pv_run<8>(o, p, v, j0, j1, c); break;
      case 7: pv_run<7>(o, p, v, j0, j1, c); break;
      case 6: pv_run<6>(o, p, v, j0, j1, c); break;
      case 5: pv_run<5>(o, p, v, j0, j1, c); break;
      case 4: pv_run<4>(o, p, v, j0, j1, c); break;
      case 3: pv_run<3>(o, p, v, j0, j1, c); break;
      case 2: pv_run<2>(o, p, v, j0, j1, c); break;
      default: pv_run<1>(o, p, v, j0, j1, c); break;
    }
  }
}

// n cache values (n a multiple of 8) as fp32, exactly.
inline void widen(const bf16* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(out + i, load8(x + i));
}
inline void widen(const float*, int64_t, float*) {}

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

template <class T>
void attention(const float* q, const T* kc, const T* vc, const int64_t* rows, const int64_t* start,
               const int64_t* offsets, const int64_t* pos, const int64_t* parent, int64_t B, int64_t H,
               int64_t Hkv, int64_t C, int64_t D, float scale, int64_t window, float* out) {
  const int64_t G = H / Hkv;
  // task table: sequence b has Hkv * chunks(b) tasks, chunks of up to ATT_QG of its T_b * G queries
  std::vector<int64_t> first_task(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t t_b = offsets[b + 1] - offsets[b], per_head = t_b * G, qg = ATT_QG;
    first_task[b + 1] = first_task[b] + Hkv * ((per_head + qg - 1) / qg);
  }
  const int64_t tasks = first_task[B];
  const int64_t stride = ((C + 15) / 16) * 16;           // score row, room for a full last group
  constexpr bool kWide = !std::is_same_v<T, float>;
  if (D > MAX_HEAD_DIM) return;
#pragma omp parallel num_threads(threads())
  {
    float* s = static_cast<float*>(std::aligned_alloc(64, ATT_QG * stride * 4));
    float* obuf = static_cast<float*>(std::aligned_alloc(64, ((ATT_QG * D * 4 + 63) / 64) * 64));
    float* vwide = kWide ? static_cast<float*>(std::aligned_alloc(64, KEY_CHUNK * D * 4)) : nullptr;
    float kwide[8 * MAX_HEAD_DIM];
    int64_t path[ATT_QG][MAX_TREE_TOKENS];
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      int64_t b = 0;
      while (first_task[b + 1] <= task) ++b;
      const int64_t local = task - first_task[b], t_b = offsets[b + 1] - offsets[b], per_head = t_b * G;
      const int64_t qg = ATT_QG, chunks = (per_head + qg - 1) / qg;
      const int64_t chunk = local % chunks, hk = local / chunks;
      const int64_t q0 = chunk * qg, nq = per_head - q0 < qg ? per_head - q0 : qg;
      const int64_t base = (rows[b] * Hkv + hk) * C * D, s0 = start[b], o0 = offsets[b];
      const T *kb = kc + base, *vb = vc + base;
      const float* qv[ATT_QG];
      float* ov[ATT_QG];
      KeyPath<T> kp[ATT_QG], vp[ATT_QG];
      int64_t n[ATT_QG], lo[ATT_QG], nmax = 0;
      float inv[ATT_QG];
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = (q0 + i) / G, h = hk * G + (q0 + i) % G, bt = o0 + t;
        qv[i] = q + (bt * H + h) * D;
        ov[i] = out + (bt * H + h) * D;
        const int64_t* slots = nullptr;
        if (parent) {            // the path root..t, as absolute cache slots
          int64_t depth = 0;
          for (int64_t u = t; u >= 0; u = parent[o0 + u]) ++depth;
          int64_t x = depth;
          for (int64_t u = t; u >= 0; u = parent[o0 + u]) path[i][--x] = s0 + u;
          slots = path[i];
          n[i] = s0 + depth;
        } else {
          n[i] = pos[bt] + 1;
        }
        lo[i] = window > 0 && n[i] > window ? n[i] - window : 0;       // first key in the window
        kp[i] = KeyPath<T>{kb, D, s0, slots};
        vp[i] = KeyPath<T>{vb, D, s0, slots};
        nmax = n[i] > nmax ? n[i] : nmax;
      }
      // 1. scores, 8 keys at a time (a chain's group may read cache slots past n: the capacity is
      //    a multiple of 8; those lanes are masked).  A score's bits depend only on q and k_j.
      __m256 mxv[ATT_QG];
      for (int64_t i = 0; i < nq; ++i) mxv[i] = _mm256_set1_ps(-INFINITY);
      for (int64_t j = 0; j < nmax; j += 8) {
        for (int64_t l = 0; l < 8 * D; l += 16) {
          _mm_prefetch(reinterpret_cast<const char*>(kb + (j + ATT_PREFETCH) * D + l), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(vb + (j + ATT_PREFETCH) * D + l), _MM_HINT_T1);
        }
        // a bf16 cache's 8 keys, when every query of the group reads them (a chain's, or a tree's
        // cached prefix), widened once for all of them (the same fp32 values load8 gives)
        const bool widened = kWide && nq > 1 && (!parent || j + 8 <= s0);
        if (widened) widen(kb + j * D, 8 * D, kwide);
        for (int64_t i = 0; i < nq; ++i) {
          if (j >= n[i] || j + 8 <= lo[i]) continue;                     // past the query, or before its window
          __m256 sc;
          if (widened) {
            sc = scores8(qv[i], [&](int r) { return kwide + r * D; }, D);
          } else if (!kp[i].slot || j + 8 <= s0) {
            sc = scores8(qv[i], [&](int r) { return kb + (j + r) * D; }, D);
          } else {
            const KeyPath<T>& k = kp[i];
            const int64_t ni = n[i];
            sc = scores8(qv[i], [&](int r) { return j + r < ni ? k.row(j + r) : kb; }, D);
          }
          sc = _mm256_mul_ps(sc, _mm256_set1_ps(scale));
          if (n[i] - j < 8) sc = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, tail_mask(n[i] - j));
          if (lo[i] > j) sc = _mm256_blendv_ps(sc, _mm256_set1_ps(-INFINITY), tail_mask(lo[i] - j));
          _mm256_storeu_ps(s + i * stride + j, sc);
          mxv[i] = _mm256_max_ps(mxv[i], sc);
        }
      }
      // 2. p_j = exp(s_j - max), summed lane-wise (key j in lane j % 8; padding adds exact zeros)
      for (int64_t i = 0; i < nq; ++i) {
        const __m256 mv = _mm256_set1_ps(hmax(mxv[i]));
        __m256 sum = _mm256_setzero_ps();
        float* si = s + i * stride;
        for (int64_t j = lo[i] / 8 * 8; j < n[i]; j += 8) {
          __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(si + j), mv));
          if (n[i] - j < 8) e = _mm256_and_ps(e, tail_mask(n[i] - j));
          if (lo[i] > j) e = _mm256_andnot_ps(tail_mask(lo[i] - j), e);        // keys before the window: 0
          _mm256_storeu_ps(si + j, e);
          sum = _mm256_add_ps(sum, e);
        }
        inv[i] = 1.0f / hsum(sum);
      }
      // 3. o = sum_j p_j v_j in key order, in chunks of keys shared by the group's queries
      const int64_t V = D / 8;
      for (int64_t i = 0; i < nq * D; i += 8) _mm256_storeu_ps(obuf + i, _mm256_setzero_ps());
      for (int64_t j0 = 0; j0 < nmax; j0 += KEY_CHUNK) {
        // a bf16 cache's values that every query of the group reads (keys j0 .. shared-1), widened once
        int64_t shared = j0;
        if (kWide && nq > 1) {
          const int64_t end = parent && s0 < nmax ? s0 : nmax;
          shared = j0 + KEY_CHUNK < end ? j0 + KEY_CHUNK : end;
          if (shared > j0) widen(vb + j0 * D, (shared - j0) * D, vwide);
        }
        const KeyPath<float> vw{kWide ? vwide - j0 * D : nullptr, D, s0, nullptr};   // row j: widened key j
        for (int64_t i = 0; i < nq; ++i) {
          const int64_t j1 = j0 + KEY_CHUNK < n[i] ? j0 + KEY_CHUNK : n[i];
          if (j0 >= j1 || j1 <= lo[i]) continue;
          float* oi = obuf + i * D;
          const float* si = s + i * stride;
          const int64_t jb = j0 > lo[i] ? j0 : lo[i], jw = shared < j1 ? shared : j1;
          if (jb < jw) {                                 // the keys in key order: widened ones, then the rest
            pv_keys(oi, si, vw, jb, jw, V);
            pv_keys(oi, si, vp[i], jw, j1, V);
          } else {
            pv_keys(oi, si, vp[i], jb, j1, V);
          }
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
    std::free(vwide);
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
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; i += 8) {
      const __m256 g = _mm256_loadu_ps(gu + m * 2 * I + i), u = _mm256_loadu_ps(gu + m * 2 * I + I + i);
      const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g))));
      _mm256_storeu_ps(out + m * I + i, _mm256_mul_ps(s, u));
    }
}

// gu: [M, 2I] (gate | up) -> out: [M, I] = gelu_tanh(gate) * up, with
// gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) (Gemma's MLP), element by element.
void ss_gelu_tanh_mul(const float* gu, int64_t M, int64_t I, float* out) {
  const float c = 0.7978845608028654f, a = 0.044715f;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; ++i) {
      const float g = gu[m * 2 * I + i], u = gu[m * 2 * I + I + i];
      out[m * I + i] = 0.5f * g * (1.0f + std::tanh(c * (g + a * g * g * g))) * u;
    }
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

// q: [N, H, D]; kc, vc: [R, Hkv, C, D] of fp32 (kv 0) or bf16 (kv 1); rows, start: [B]; offsets: [B+1]
// (ragged layout, above);
// pos: [N] rotary positions; parent: [N] index of each token's parent among its sequence's tokens
// (-1 for a root), or null for chains; window: a query sees only keys at positions > its own - window
// (virtual index = position; 0: every key); out: [N, H, D].
// Token t of sequence b attends to the cached prefix (slots 0..start[b]-1 of row rows[b]) and to its
// ancestors in the pass and itself (slots start[b] + ancestor index), taken in virtual order (see
// KeyPath).  For a chain that is slots 0..start[b]+t.
// Work is split by (sequence, kv head, group of up to QG query heads sharing that kv head), so a key
// or value block loaded for one query is reused from L1 by the others.  Each query's result is the
// same sequence of operations whatever group it is in and wherever its path's keys are stored:
// scores by scores8, softmax with a lane-wise sum (virtual key j in lane j % 8), then
// o += p_j v_j in virtual key order (o parked in memory between key chunks: exact).
void ss_attention(const float* q, const void* kc, const void* vc, const int64_t* rows, const int64_t* start,
                  const int64_t* offsets, const int64_t* pos, const int64_t* parent, int64_t B, int64_t H,
                  int64_t Hkv, int64_t C, int64_t D, float scale, int64_t window, float* out, int64_t kv) {
  if (kv) attention(q, static_cast<const bf16*>(kc), static_cast<const bf16*>(vc), rows, start, offsets, pos, parent,
                    B, H, Hkv, C, D, scale, window, out);
  else attention(q, static_cast<const float*>(kc), static_cast<const float*>(vc), rows, start, offsets, pos, parent,
                 B, H, Hkv, C, D, scale, window, out);
}

}  // extern "C"
