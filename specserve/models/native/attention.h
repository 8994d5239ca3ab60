// Attention over the KV cache for a ragged pass of chains and trees (see simd.h for the invariance
// argument and ss_attention in attention.cpp for the arguments).
//
// Included once per instruction-set path, each time compiled with that path's flags: SS_ATT_PATH 0
// (AVX2 + FMA, attention.cpp, every machine) and 1 (AVX-512F, attention_avx512.cpp, chosen at run
// time where the CPU has it).  Everything here has internal linkage, so the paths never share a
// compiled function.
//
// THE SAME BITS ON BOTH PATHS.  Per query and key, the score is eight lane-wise FMA chains over the
// head dimension (lane l: dims l, l+8, ...) reduced by one fixed tree, ((l0+l1)+(l2+l3)) +
// ((l4+l5)+(l6+l7)), then scaled; softmax takes the max, exp8 and a lane-wise sum over key blocks in
// order; o[e] is one FMA chain over the keys in order.  The AVX-512 path computes exactly these
// sequences, two or four queries at a time: a 512-bit register holds two 8-lane chains side by side
// (query a's and query b's against the same key), its tree is the AVX2 tree applied to each half
// (vhaddps emulated per 128-bit lane), and in o += p_j v_j each of its 16 lanes is one element's
// chain.  Which queries run together never changes a query's operations, so a result is the same
// alone or batched, on either path, at any thread count.

#pragma once

#include <type_traits>
#include <vector>

#include "simd.h"

#ifndef SS_ATT_PATH
#error "define SS_ATT_PATH before including attention.h"
#endif

namespace ss {
namespace {

// Queries sharing one kv head processed together, so that each key and value block read from
// memory serves all of them: up to 16, for decoding, verification and prompt chunks alike.
constexpr int64_t ATT_QG = 16;
// Keys ahead of the scores that the next keys and values are prefetched for (keys into L1, values,
// read after all the scores, into L2): the rows of one (sequence, kv head) are contiguous, and
// reaching past them (into the next head's rows or past the cache) only wastes a prefetch.
constexpr int64_t ATT_PREFETCH = 32;
constexpr int64_t KEY_CHUNK = 64;         // keys per run of o += p v, shared by a group's queries
constexpr int64_t MAX_HEAD_DIM = 256;     // (the Python side refuses larger heads)
// Longest path a tree pass may hold (the Python side refuses larger tree passes).
constexpr int64_t MAX_TREE_TOKENS = 256;

// The cache's element types: fp32, or bf16 (an fp32's top 16 bits).  Attention reads either back
// as fp32, exactly, and computes the same fp32 operations over them.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// n cache values (n a multiple of 8) as fp32, exactly.
inline void widen(const bf16* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(out + i, load8(x + i));
}
inline void widen(const float*, int64_t, float*) {}

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

#if SS_ATT_PATH == 1
// Four queries at a time on 512-bit registers (the header's argument): queries are taken in pairs,
// each pair's q interleaved per 8-dim chunk (pair buffer: [chunk c][query a's 8 dims, query b's 8]).
constexpr bool kQuads = true;

inline __m512 bcast8(const float* p) {      // 8 floats into both halves
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}
// vhaddps on each 256-bit half: per 128-bit lane [x0+x1, x2+x3, y0+y1, y2+y3].
inline __m512 hadd2(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD));
}
// Eight accumulators holding (query a | query b) x key r -> each query's 8 scores, by scores8's tree.
inline void reduce_pair(const __m512* a, __m256* sa, __m256* sb) {
  const __m512 t0 = hadd2(hadd2(a[0], a[1]), hadd2(a[2], a[3]));
  const __m512 t1 = hadd2(hadd2(a[4], a[5]), hadd2(a[6], a[7]));
  // [a keys 0-3 | b keys 0-3 | a keys 4-7 | b keys 4-7], each the lower 128 bits' sums + the upper's
  const __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 r = _mm512_shuffle_f32x4(s, s, _MM_SHUFFLE(3, 1, 2, 0));
  *sa = _mm512_castps512_ps256(r);
  *sb = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r), 1));
}
// Scores of four queries (pair buffers qa, qb) against 8 consecutive fp32 rows.
inline void scores8x4(const float* qa, const float* qb, const float* rows, int64_t D, __m256* out) {
  __m512 a[8], b[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) a[r] = b[r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < D; c += 8) {
    const __m512 x = _mm512_loadu_ps(qa + 2 * c), y = _mm512_loadu_ps(qb + 2 * c);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      const __m512 k = bcast8(rows + r * D + c);
      a[r] = _mm512_fmadd_ps(x, k, a[r]);
      b[r] = _mm512_fmadd_ps(y, k, b[r]);
    }
  }
  reduce_pair(a, out, out + 1);
  reduce_pair(b, out + 2, out + 3);
}
// o_u[c .. c + 16W) += p_u[j] v_j for four queries u (o_u = o + u * os, p_u = p + u * ps) over
// consecutive fp32 rows j = j0 .. j1-1 in order: each lane one element's chain.
template <int W>
inline void pv4_run(float* o, int64_t os, const float* p, int64_t ps, const float* rows, int64_t D, int64_t j0,
                    int64_t j1, int64_t c) {
  __m512 acc[4][W];
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u)
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) acc[u][w] = _mm512_loadu_ps(o + u * os + c + 16 * w);
  for (int64_t j = j0; j < j1; ++j) {
    const float* vj = rows + j * D + c;
    __m512 v[W];
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) v[w] = _mm512_loadu_ps(vj + 16 * w);
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const __m512 pj = _mm512_set1_ps(p[u * ps + j]);
#pragma GCC unroll 4
      for (int w = 0; w < W; ++w) acc[u][w] = _mm512_fmadd_ps(pj, v[w], acc[u][w]);
    }
  }
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u)
#pragma GCC unroll 4
    for (int w = 0; w < W; ++w) _mm512_storeu_ps(o + u * os + c + 16 * w, acc[u][w]);
}
inline void pv4(float* o, int64_t os, const float* p, int64_t ps, const float* rows, int64_t D, int64_t j0,
                int64_t j1) {
  for (int64_t c = 0; c < D; c += 64) {
    switch ((D - c) / 16 < 4 ? (D - c) / 16 : 4) {
      case 4: pv4_run<4>(o, os, p, ps, rows, D, j0, j1, c); break;
      case 3: pv4_run<3>(o, os, p, ps, rows, D, j0, j1, c); break;
      case 2: pv4_run<2>(o, os, p, ps, rows, D, j0, j1, c); break;
      default: pv4_run<1>(o, os, p, ps, rows, D, j0, j1, c); break;
    }
  }
}
#else
constexpr bool kQuads = false;
inline void scores8x4(const float*, const float*, const float*, int64_t, __m256*) {}
inline void pv4(float*, int64_t, const float*, int64_t, const float*, int64_t, int64_t, int64_t) {}
#endif

// One thread's buffers, reused by all its tasks.
struct Scratch {
  float* s;          // [ATT_QG, stride] scores, then probabilities
  float* obuf;       // [ATT_QG, D] outputs between key chunks
  float* vwide;      // [KEY_CHUNK, D] a bf16 chunk's shared values widened
  float* qpair;      // [ATT_QG / 2, 2 D] queries interleaved in pairs (quads only)
  float kwide[8 * MAX_HEAD_DIM];
  int64_t path[ATT_QG][MAX_TREE_TOKENS];
};

// A task: up to ATT_QG queries of one sequence sharing kv head hk, and each query's keys.
template <class T>
struct Task {
  int64_t nq = 0, nmax = 0, s0 = 0, D = 0;
  const T *kb = nullptr, *vb = nullptr;     // this (row, kv head)'s keys and values
  bool tree = false;
  const float* qv[ATT_QG];
  float* ov[ATT_QG];
  KeyPath<T> vp[ATT_QG];
  int64_t n[ATT_QG], lo[ATT_QG];            // keys 0 .. n-1 in virtual order, the first lo masked (window)
  float inv[ATT_QG];
  bool active(int64_t i, int64_t j) const { return j < n[i] && j + 8 > lo[i]; }   // keys j .. j+7 of query i
};

// 1. scores, 8 keys at a time (a chain's group may read cache slots past n: the capacity is a
//    multiple of 8; those lanes are masked).  A score's bits depend only on q and k_j.
template <class T>
void task_scores(const Task<T>& t, Scratch& w, int64_t stride, float scale, __m256* mxv) {
  constexpr bool kWide = !std::is_same_v<T, float>;
  const int64_t D = t.D;
  const bool quads = kQuads && D % 16 == 0 && t.nq >= 4;
  for (int64_t i = 0; i < t.nq; ++i) mxv[i] = _mm256_set1_ps(-INFINITY);
  auto finish = [&](int64_t i, int64_t j, __m256 sc) {
    sc = _mm256_mul_ps(sc, _mm256_set1_ps(scale));
    if (t.n[i] - j < 8) sc = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, tail_mask(t.n[i] - j));
    if (t.lo[i] > j) sc = _mm256_blendv_ps(sc, _mm256_set1_ps(-INFINITY), tail_mask(t.lo[i] - j));
    _mm256_storeu_ps(w.s + i * stride + j, sc);
    mxv[i] = _mm256_max_ps(mxv[i], sc);
  };
  for (int64_t j = 0; j < t.nmax; j += 8) {
    for (int64_t l = 0; l < 8 * D; l += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(t.kb + (j + ATT_PREFETCH) * D + l), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(t.vb + (j + ATT_PREFETCH) * D + l), _MM_HINT_T1);
    }
    // keys every query reads (a chain's, or a tree's cached prefix): a bf16 cache's widened once
    const bool shared = !t.tree || j + 8 <= t.s0;
    const bool widened = kWide && t.nq > 1 && shared;
    if (widened) widen(t.kb + j * D, 8 * D, w.kwide);
    int64_t i = 0;
    if (quads && shared) {
      const float* rows = widened ? w.kwide : reinterpret_cast<const float*>(t.kb + j * D);
      for (; i + 4 <= t.nq; i += 4) {
        if (!(t.active(i, j) || t.active(i + 1, j) || t.active(i + 2, j) || t.active(i + 3, j))) continue;
        __m256 sc[4];
        scores8x4(w.qpair + i * D, w.qpair + (i + 2) * D, rows, D, sc);
        for (int u = 0; u < 4; ++u)
          if (t.active(i + u, j)) finish(i + u, j, sc[u]);
      }
    }
    for (; i < t.nq; ++i) {
      if (!t.active(i, j)) continue;                     // past the query, or before its window
      if (widened) {
        finish(i, j, scores8(t.qv[i], [&](int r) { return w.kwide + r * D; }, D));
      } else if (shared) {
        finish(i, j, scores8(t.qv[i], [&](int r) { return t.kb + (j + r) * D; }, D));
      } else {
        const KeyPath<T> k{t.kb, D, t.s0, t.vp[i].slot};
        const int64_t ni = t.n[i];
        finish(i, j, scores8(t.qv[i], [&](int r) { return j + r < ni ? k.row(j + r) : t.kb; }, D));
      }
    }
  }
}

// 2. p_j = exp(s_j - max), summed lane-wise (key j in lane j % 8; padding adds exact zeros)
template <class T>
void task_softmax(Task<T>& t, Scratch& w, int64_t stride, const __m256* mxv) {
  for (int64_t i = 0; i < t.nq; ++i) {
    const __m256 mv = _mm256_set1_ps(hmax(mxv[i]));
    __m256 sum = _mm256_setzero_ps();
    float* si = w.s + i * stride;
    for (int64_t j = t.lo[i] / 8 * 8; j < t.n[i]; j += 8) {
      __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(si + j), mv));
      if (t.n[i] - j < 8) e = _mm256_and_ps(e, tail_mask(t.n[i] - j));
      if (t.lo[i] > j) e = _mm256_andnot_ps(tail_mask(t.lo[i] - j), e);        // keys before the window: 0
      _mm256_storeu_ps(si + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    t.inv[i] = 1.0f / hsum(sum);
  }
}

// 3. o = sum_j p_j v_j in key order, in chunks of keys shared by the group's queries; o parked in
//    obuf between chunks (exact).  Within a chunk, query i runs its keys [jb, j1) in order: the keys
//    its quad runs together, [J0, J1), after its own keys before J0 and before its own keys after J1.
template <class T>
void task_values(const Task<T>& t, Scratch& w, int64_t stride) {
  constexpr bool kWide = !std::is_same_v<T, float>;
  const int64_t D = t.D, V = D / 8;
  const bool quads = kQuads && D % 16 == 0 && t.nq >= 4;
  for (int64_t i = 0; i < t.nq * D; i += 8) _mm256_storeu_ps(w.obuf + i, _mm256_setzero_ps());
  const int64_t shared_to = t.tree && t.s0 < t.nmax ? t.s0 : t.nmax;     // rows every query reads
  for (int64_t j0 = 0; j0 < t.nmax; j0 += KEY_CHUNK) {
    const int64_t end = j0 + KEY_CHUNK < t.nmax ? j0 + KEY_CHUNK : t.nmax;
    const int64_t shared = shared_to < end ? shared_to : end;          // keys j0 .. shared-1 shared
    int64_t wide_to = j0;                                                // keys j0 .. wide_to-1 widened
    if (kWide && t.nq > 1 && shared > j0) {
      widen(t.vb + j0 * D, (shared - j0) * D, w.vwide);
      wide_to = shared;
    }
    const KeyPath<float> vw{kWide ? w.vwide - j0 * D : nullptr, D, t.s0, nullptr};   // row j: widened value j
    auto own = [&](int64_t i, int64_t a, int64_t b) {     // query i's keys a .. b-1: widened ones, then the rest
      const int64_t m = wide_to < b ? wide_to : b;
      if (a < m) pv_keys(w.obuf + i * D, w.s + i * stride, vw, a, m, V);
      pv_keys(w.obuf + i * D, w.s + i * stride, t.vp[i], a > m ? a : m, b, V);
    };
    auto range = [&](int64_t i, int64_t* a, int64_t* b) {
      *a = j0 > t.lo[i] ? j0 : t.lo[i];
      *b = j0 + KEY_CHUNK < t.n[i] ? j0 + KEY_CHUNK : t.n[i];
    };
    int64_t i = 0;
    if (quads) {
      const float* rows = kWide ? w.vwide - j0 * D : reinterpret_cast<const float*>(t.vb);
      for (; i + 4 <= t.nq; i += 4) {
        int64_t a[4], b[4], J0 = j0, J1 = shared;
        for (int u = 0; u < 4; ++u) {
          range(i + u, a + u, b + u);
          J0 = a[u] > J0 ? a[u] : J0;
          J1 = b[u] < J1 ? b[u] : J1;
        }
        if (J0 >= J1) {
          for (int u = 0; u < 4; ++u) own(i + u, a[u], b[u]);
          continue;
        }
        for (int u = 0; u < 4; ++u) own(i + u, a[u], J0);
        pv4(w.obuf + i * D, D, w.s + i * stride, stride, rows, D, J0, J1);
        for (int u = 0; u < 4; ++u) own(i + u, J1, b[u]);
      }
    }
    for (; i < t.nq; ++i) {
      int64_t a, b;
      range(i, &a, &b);
      own(i, a, b);
    }
  }
  for (int64_t i = 0; i < t.nq; ++i) {
    const __m256 iv = _mm256_set1_ps(t.inv[i]);
    for (int64_t c = 0; c < V; ++c)
      _mm256_storeu_ps(t.ov[i] + 8 * c, _mm256_mul_ps(_mm256_loadu_ps(w.obuf + i * D + 8 * c), iv));
  }
}

// ss_attention's arguments (attention.cpp), for one cache element type.
template <class T>
struct Args {
  const float* q;
  const T *kc, *vc;
  const int64_t *rows, *start, *offsets, *pos, *parent;
  int64_t B, H, Hkv, C, D;
  float scale;
  int64_t window;
  float* out;
};

// The queries of task (sequence b, kv head hk, queries q0 .. q0+nq-1 of its T_b * G), with their keys.
template <class T>
void make_task(Task<T>& t, Scratch& w, const Args<T>& a, int64_t b, int64_t hk, int64_t q0, int64_t nq) {
  const int64_t D = a.D, G = a.H / a.Hkv, base = (a.rows[b] * a.Hkv + hk) * a.C * D, o0 = a.offsets[b];
  t.nq = nq, t.nmax = 0, t.s0 = a.start[b], t.D = D, t.tree = a.parent != nullptr;
  t.kb = a.kc + base, t.vb = a.vc + base;
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t tok = (q0 + i) / G, h = hk * G + (q0 + i) % G, bt = o0 + tok;
    t.qv[i] = a.q + (bt * a.H + h) * D;
    t.ov[i] = a.out + (bt * a.H + h) * D;
    const int64_t* slots = nullptr;
    if (a.parent) {            // the path root..tok, as absolute cache slots
      int64_t depth = 0;
      for (int64_t u = tok; u >= 0; u = a.parent[o0 + u]) ++depth;
      int64_t x = depth;
      for (int64_t u = tok; u >= 0; u = a.parent[o0 + u]) w.path[i][--x] = t.s0 + u;
      slots = w.path[i];
      t.n[i] = t.s0 + depth;
    } else {
      t.n[i] = a.pos[bt] + 1;
    }
    t.lo[i] = a.window > 0 && t.n[i] > a.window ? t.n[i] - a.window : 0;       // first key in the window
    t.vp[i] = KeyPath<T>{t.vb, D, t.s0, slots};
    t.nmax = t.n[i] > t.nmax ? t.n[i] : t.nmax;
  }
  if (kQuads && D % 16 == 0)            // the pair buffers: [chunk][query 2p's 8 dims, query 2p+1's 8]
    for (int64_t i = 0; i + 1 < nq; i += 2)
      for (int64_t c = 0; c < D; c += 8) {
        std::memcpy(w.qpair + i * D + 2 * c, t.qv[i] + c, 32);
        std::memcpy(w.qpair + i * D + 2 * c + 8, t.qv[i + 1] + c, 32);
      }
}

// The kernel on `threads` threads.  Work is split by (sequence, kv head, group of up to ATT_QG
// queries sharing that kv head), so a key or value block loaded for one query serves the others.
template <class T>
void attention(const Args<T>& a, int threads) {
  if (a.D > MAX_HEAD_DIM || a.D % 8) return;
  const int64_t G = a.H / a.Hkv;
  // task table: sequence b has Hkv * chunks(b) tasks, chunks of up to ATT_QG of its T_b * G queries
  std::vector<int64_t> first_task(a.B + 1, 0);
  for (int64_t b = 0; b < a.B; ++b) {
    const int64_t per_head = (a.offsets[b + 1] - a.offsets[b]) * G;
    first_task[b + 1] = first_task[b] + a.Hkv * ((per_head + ATT_QG - 1) / ATT_QG);
  }
  const int64_t tasks = first_task[a.B];
  const int64_t stride = ((a.C + 15) / 16) * 16;           // score row, room for a full last group
#pragma omp parallel num_threads(threads)
  {
    Scratch* w = static_cast<Scratch*>(std::aligned_alloc(64, (sizeof(Scratch) + 63) / 64 * 64));
    w->s = static_cast<float*>(std::aligned_alloc(64, ATT_QG * stride * 4));
    w->obuf = static_cast<float*>(std::aligned_alloc(64, ATT_QG * MAX_HEAD_DIM * 4));
    w->vwide = static_cast<float*>(std::aligned_alloc(64, KEY_CHUNK * MAX_HEAD_DIM * 4));
    w->qpair = static_cast<float*>(std::aligned_alloc(64, ATT_QG * MAX_HEAD_DIM * 4));
    Task<T> t;
    __m256 mxv[ATT_QG];
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      int64_t b = 0;
      while (first_task[b + 1] <= task) ++b;
      const int64_t per_head = (a.offsets[b + 1] - a.offsets[b]) * G, chunks = (per_head + ATT_QG - 1) / ATT_QG;
      const int64_t local = task - first_task[b], q0 = (local % chunks) * ATT_QG;
      make_task(t, *w, a, b, local / chunks, q0, per_head - q0 < ATT_QG ? per_head - q0 : ATT_QG);
      task_scores(t, *w, stride, a.scale, mxv);
      task_softmax(t, *w, stride, mxv);
      task_values(t, *w, stride);
    }
    std::free(w->s);
    std::free(w->obuf);
    std::free(w->vwide);
    std::free(w->qpair);
    std::free(w);
  }
}

// The kernel for a cache of either element type (kv 0: fp32, 1: bf16), ss_attention's arguments.
inline void attention_any(const float* q, const void* kc, const void* vc, const int64_t* rows, const int64_t* start,
                          const int64_t* offsets, const int64_t* pos, const int64_t* parent, int64_t B, int64_t H,
                          int64_t Hkv, int64_t C, int64_t D, float scale, int64_t window, float* out, int64_t kv,
                          int threads) {
  if (kv)
    attention(Args<bf16>{q, static_cast<const bf16*>(kc), static_cast<const bf16*>(vc), rows, start, offsets, pos,
                         parent, B, H, Hkv, C, D, scale, window, out}, threads);
  else
    attention(Args<float>{q, static_cast<const float*>(kc), static_cast<const float*>(vc), rows, start, offsets,
                          pos, parent, B, H, Hkv, C, D, scale, window, out}, threads);
}

}  // namespace
}  // namespace ss
