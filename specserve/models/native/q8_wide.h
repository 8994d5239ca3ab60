// The int8 products on 512-bit registers (SS_Q8_PATH 3, AVX512-VNNI): two row groups of q8.h's packed
// layout side by side, 16 output rows in the 16 lanes of one register, so each vpdpbusd does twice
// the work of the 256-bit paths' (on CPUs whose 512-bit units are not split in two halves).
//
// THE SAME BITS.  Lanes 0-7 hold group g's rows and lanes 8-15 group g+1's, each lane computing the
// exact integer block sums of q8.h and then the same float sequence per output element (over blocks
// in increasing order: fma(float(I), dw * dx, acc), then the offset term, then bias / accumulate), so
// every output equals the 256-bit paths' bit for bit.  Groups are taken in pairs; an odd last group
// runs on q8.h's 256-bit tile.
//
// Included by q8_entry.h after q8.h, for paths 3 and 4.  Path 4 (tiled by the pass) reads the
// activations block-major (ActRuns) and prefetches both weight streams in the order it reads them;
// path 3 keeps its first form (row-major activations, each stream's own prefetch) to compare against.

#pragma once

#include <vector>

namespace {

// Two 256-bit halves as one register: lo in lanes 0-7, hi in 8-15.
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
inline __m512 join(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

// Step s's value bytes of two blocks (groups g and g+1), as the multiply reads them.
template <class P>
inline __m512i step_values2(const uint8_t* b0, const uint8_t* b1, int s) {
  auto both = [&](int off) {
    return join(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + off)),
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + off)));
  };
  if constexpr (P::bits == 8) {
    return both(32 * s);
  } else {
    const __m512i raw = both(32 * (s & 3));
    const __m512i lo = _mm512_and_si512(s < 4 ? raw : _mm512_srli_epi16(raw, 4), _mm512_set1_epi8(0x0F));
    if constexpr (P::bits == 4) return lo;
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(both(128 + 32 * (s >> 2)), 2 * (s & 3)), _mm512_set1_epi8(3));
    return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
  }
}

// raw - bias * sum(qx), given that product (the view's bias_sum).
template <class P>
inline __m512i unbias2(__m512i raw, int32_t bias_sum) {
  if constexpr (P::bias == 0) return raw;
  return _mm512_sub_epi32(raw, _mm512_set1_epi32(bias_sum));
}

// Path 4 prefetches both weight streams ahead in the order a thread reads them; path 3 keeps its
// first prefetch (each stream's address plus the distance), which near a group's end fetches the
// pair's other group, already being read, and never the next pair's second group.
constexpr bool kFollowStreams = SS_Q8_PATH == 4;

// The same activations block-major (path 4): block b's 32 bytes of tokens 0 .. M-1 side by side, and
// their d, sx and hs likewise, so a tile reaches each of its tokens at a fixed offset from one
// pointer (row-major, each token needs a pointer of its own: with 12 tokens they crowd out the
// registers the loop needs).  Exact copies: the products are the same.
struct ActRuns {
  const int8_t* q;       // [nb, M, 32]
  const float* d;        // [nb, M]
  const float* sx;       // [nb, M]
  const int32_t* bhs;    // [nb, M, 3]: Act::bias_sum's three values, for the format the copy was made for
  int64_t M, nb;
  const int8_t* block(int64_t b, int64_t m0) const { return q + (b * M + m0) * 32; }
  static constexpr int64_t token_stride() { return 32; }
  int64_t at(int64_t b, int64_t m) const { return b * M + m; }
  template <class P>
  int32_t bias_sum(int64_t ab, int h) const { return bhs[3 * ab + h]; }
};

// a (row-major) copied block-major into buf (grown as needed), with format P's bias sums.
template <class P>
inline ActRuns block_major(const Act& a, int64_t M, std::vector<uint8_t>& buf) {
  const int64_t nb = a.nb, n = nb * M;
  const size_t need = static_cast<size_t>(n * 32 + n * 20 + 64);
  if (buf.size() < need) buf.resize(need);
  int8_t* q = reinterpret_cast<int8_t*>(buf.data());
  float* d = reinterpret_cast<float*>(buf.data() + n * 32);
  float* sx = d + n;
  int32_t* bhs = reinterpret_cast<int32_t*>(sx + n);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t i = b * M + m, j = m * nb + b;
      std::memcpy(q + 32 * i, a.q + m * a.K + 32 * b, 32);
      d[i] = a.d[j];
      sx[i] = a.sx[j];
      for (int h = 0; h < 3; ++h) bhs[3 * i + h] = a.bias_sum<P>(j, h);
    }
  return ActRuns{q, d, sx, bhs, M, nb};
}

// MB tokens x the 16 output rows of groups g, g+1 (q8.h's tile, two groups wide), activations read
// through view A (Act or ActRuns).
template <class P, int MB, class A>
inline void tile2(const uint8_t* w, int64_t gstride, int64_t g, const A& a, int64_t m0, float* y, int64_t N,
                  int64_t ldy, const float* bias, bool accumulate) {
  constexpr int BB = block_bytes<P>(), HO = halves_offset<P>();
  __m512 acc[MB];
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* g0 = w + g * gstride;
    const uint8_t* b0 = g0 + block_offset_for(SS_PQ(P), b);
    const uint8_t* b1 = b0 + gstride;
    if constexpr (kFollowStreams) {
      // Both streams ahead in the order this thread reads them: past the pair's end, into the next
      // pair's two groups (a thread's pairs are contiguous), not into the other group of this pair.
      int64_t ahead = block_offset_for(SS_PQ(P), b) + SS_Q8_PREFETCH;
      const uint8_t* p0 = g0;
      if (ahead >= gstride) { ahead -= gstride; p0 += 2 * gstride; }
      for (int l = 0; l < BB; l += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(p0 + ahead + l), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p0 + gstride + ahead + l), _MM_HINT_T0);
      }
    } else {
      for (int l = 0; l < BB; l += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(b0 + SS_Q8_PREFETCH + l), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(b1 + SS_Q8_PREFETCH + l), _MM_HINT_T0);
      }
    }
    const int8_t* x = a.block(b, m0);                 // token i's block: x + i * a.token_stride()
    __m512i I[MB], odd[MB], half[MB];
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) I[i] = odd[i] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      const __m512i wv = step_values2<P>(b0, b1, s);
#pragma GCC unroll 16
      for (int i = 0; i < MB; ++i) {
        const __m512i yb = _mm512_set1_epi32(load4(x + i * a.token_stride() + 4 * s));
        if (kTwoChains<MB> && (s & 1)) odd[i] = _mm512_dpbusd_epi32(odd[i], wv, yb);
        else I[i] = _mm512_dpbusd_epi32(I[i], wv, yb);
      }
      if (P::halves && s == 3) {
#pragma GCC unroll 16
        for (int i = 0; i < MB; ++i) {
          half[i] = _mm512_add_epi32(I[i], odd[i]);
          I[i] = odd[i] = _mm512_setzero_si512();
        }
      }
    }
    __m256 dw0, dw1, mw0 = _mm256_setzero_ps(), mw1 = _mm256_setzero_ps();
    block_scales<P>(g0, b, b0, &dw0, &mw0);
    block_scales<P>(g0 + gstride, b, b1, &dw1, &mw1);
    const __m512 dw = join(dw0, dw1), mw = join(mw0, mw1);
    __m512i sc0 = _mm512_setzero_si512(), sc1 = _mm512_setzero_si512();
    if constexpr (P::halves) {
      auto eight = [](const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); };
      sc0 = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(eight(b0 + HO), eight(b1 + HO)));
      sc1 = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(eight(b0 + HO + 8), eight(b1 + HO + 8)));
    }
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) {
      const int64_t ab = a.at(b, m0 + i);
      __m512i sum = _mm512_add_epi32(I[i], odd[i]);
      if constexpr (P::halves) {
        const __m512i lo = unbias2<P>(half[i], a.template bias_sum<P>(ab, 0));
        const __m512i hi = unbias2<P>(sum, a.template bias_sum<P>(ab, 1));
        sum = _mm512_add_epi32(_mm512_mullo_epi32(lo, sc0), _mm512_mullo_epi32(hi, sc1));
      } else {
        sum = unbias2<P>(sum, a.template bias_sum<P>(ab, 2));
      }
      const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[ab]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), s, acc[i]);
      if constexpr (P::min) acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.sx[ab]), acc[i]);
    }
  }
  const int64_t n0 = g * 8;
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i) {
    float* dst = y + (m0 + i) * ldy + n0;
    if (n0 + 16 <= N) {
      __m512 v = acc[i];
      if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n0));
      if (accumulate) v = _mm512_add_ps(_mm512_loadu_ps(dst), v);
      _mm512_storeu_ps(dst, v);
    } else {
      float t[16];
      _mm512_storeu_ps(t, acc[i]);
      store_tail(t, N - n0, bias ? bias + n0 : nullptr, accumulate, dst);
    }
  }
}

// All M tokens against groups g, g+1, in q8.h's token_runs.
template <class P, class A>
inline void tokens_tile2(const uint8_t* w, int64_t gstride, int64_t g, const A& a, int64_t M, float* y, int64_t N,
                         int64_t ldy, const float* bias, bool acc) {
  token_runs(M, [&](auto mb, int64_t m) { tile2<P, decltype(mb)::value>(w, gstride, g, a, m, y, N, ldy, bias, acc); });
}

// Every token against every group, groups in pairs split over the threads, reading the activations
// through view `pairs_view` (an odd last group on the 256-bit tile, through `a`).
template <class P, class A>
void packed_linear_wide(const Act& a, const A& pairs_view, int64_t M, const uint8_t* w, int64_t N, int64_t ldy,
                        const float* bias, float* y, bool acc, int threads) {
  const int64_t groups = (N + 7) / 8, pairs = groups / 2, gstride = group_bytes<P>(a.nb);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t k = 0; k <= pairs; ++k) {
    if (k < pairs) tokens_tile2<P>(w, gstride, 2 * k, pairs_view, M, y, N, ldy, bias, acc);
    else if (groups % 2) tokens_tile<P>(w, gstride, groups - 1, a, M, y, N, ldy, bias, acc);
  }
}

}  // namespace
