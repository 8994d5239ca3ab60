// Linear layers with int8 activations: x is quantized once per input row into blocks of 32 int8
// values with an fp32 scale, and multiplied against weights repacked at load into groups of 8
// output rows (see PACKED LAYOUT below) with integer dot products.
//
// Included once per instruction-set path (SS_Q8_PATH: 0 AVX2, 1 AVX512-VNNI on 256-bit registers,
// 2 AVX-VNNI, 3 AVX512-VNNI on 512-bit registers: q8_wide.h, 4 AVX512-VNNI tiled by the pass: this
// file's tile for one or two tokens, q8_wide.h's over block-major activations for more), each time
// compiled with that path's flags; everything here has internal linkage so the
// paths never share a compiled function (a shared inline helper built with AVX-512 flags could
// otherwise be picked by the linker for the AVX2 path).
//
// THE SAME BITS ON EVERY PATH AND IN EVERY BATCH.  For output row r and 32-element block b, the
// integer I[r, b] = sum_k w[r, k] * qx[k] (Q6_K: sum over the two 16-element halves of
// scale_h * sum_k w * qx) is exact in int32 whatever instructions form it: AVX2's vpmaddubsw pair sums
// stay below its int16 saturation (weight bytes <= 63 there, or |w| <= 128 against |qx| <= 127 with
// the sign trick for Q8_0), vpdpbusd has no saturation at all.  The floats then follow one sequence
// per output element, over b in increasing order:
//     acc = fma(float(I[r, b]), dw[r, b] * dx[b], acc)
//     acc = fma(mw[r, b], sx[b], acc)                   (formats with an offset: Q4_1, Q5_1, Q4_K, Q5_K)
//     y[r] = acc (+ bias[r]) (+ y[r] when accumulating)
// where dx[b] is the activation block's scale, sx[b] = dx[b] * sum_k qx[k], and dw / mw the weight
// block's scale and offset.  Eight output rows sit in the eight lanes of one register, so no
// horizontal sum is needed; the tile shape (tokens x row groups) and the thread split only choose
// which elements are computed together.  Hence a token's outputs are bit-identical alone or with
// any number of other tokens, at any thread count, on every path.
//
// PACKED LAYOUT.  Rows are taken 8 at a time (a group; the last one padded with zero weights); a
// group is K/32 blocks in order; a block holds its 8 rows' 32 values, then the 8 rows' scales (fp16
// when the GGUF format stores fp16 scales, else fp32), then the 8 offsets where the format has them.
// Values are unsigned bytes u = w + bias:
//   8-bit values (Q8_0 bias 128, Q5_0 16, Q5_1 / Q5_K 0): 8 steps of 32 bytes; step s holds
//     row r's values 4s .. 4s+3 at bytes 4r .. 4r+3 (the 4 bytes vpdpbusd sums into lane r);
//   4-bit values (Q4_0 bias 8, Q4_1 / Q4_K 0): 4 registers of 32 bytes; register t's byte 4r+j holds
//     row r's value 4t+j in its low nibble and value 16+4t+j in its high nibble (steps t and t+4);
//   6-bit values (Q6_K bias 32): the 4-bit layout of the low 4 bits, then 2 registers of the high 2
//     bits: register t's byte 4r+j holds, at bits 2i .. 2i+1, those of row r's value 4(4t+i)+j.
// The K-quants Q4_K and Q6_K keep the file's bits: their blocks come 8 to a super-block of 256
// elements, followed by the super-block's 8 fp16 scales d (Q4_K: then 8 fp16 -dmin), and each block
// holds, after its values, the 8 rows' 6-bit integer scales (Q4_K: uint8 sc, then uint8 mn, the
// weight being (d * sc) * u + (-dmin) * mn; Q6_K: two int8 half scales, first halves then second,
// the weight (d * sc) * (u - 32)).  d * sc is exact in fp32, so these are the values the unpacked
// fp32 scales gave, bit for bit: 4.625 and 6.5625 bits a weight, where fp32 scales took 6 and 9.5.

#pragma once

#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#ifndef SS_Q8_PATH
#error "define SS_Q8_PATH before including q8.h"
#endif

// Bytes ahead of the block being multiplied that each tile prefetches the weight stream from (a
// thread's row groups are contiguous, so this runs ahead into its next groups).  The hardware
// prefetchers alone fall behind once several tokens' integer products sit between the loads
// (BENCHMARKS.md, "where the time goes", has the passes with and without it).
#ifndef SS_Q8_PREFETCH
#define SS_Q8_PREFETCH 4096
#endif

namespace {

// The packed formats' traits.  bits: 8, 6 or 4 (value bytes per block: 256, 192 or 128); bias: the
// value offset subtracted as bias * sum(qx); f16: scales stored as fp16; min: an offset term; halves:
// Q6_K's two int8 scales per row and block; super: blocks in super-blocks of 8 with integer scales.
struct PQ8_0 { static constexpr int bits = 8, bias = 128; static constexpr bool f16 = true, min = false, halves = false, super = false; };
struct PQ5_0 { static constexpr int bits = 8, bias = 16; static constexpr bool f16 = true, min = false, halves = false, super = false; };
struct PQ5_1 { static constexpr int bits = 8, bias = 0; static constexpr bool f16 = true, min = true, halves = false, super = false; };
struct PQ5_K { static constexpr int bits = 8, bias = 0; static constexpr bool f16 = false, min = true, halves = false, super = false; };
struct PQ6_K { static constexpr int bits = 6, bias = 32; static constexpr bool f16 = false, min = false, halves = true, super = true; };
struct PQ4_0 { static constexpr int bits = 4, bias = 8; static constexpr bool f16 = true, min = false, halves = false, super = false; };
struct PQ4_1 { static constexpr int bits = 4, bias = 0; static constexpr bool f16 = true, min = true, halves = false, super = false; };
struct PQ4_K { static constexpr int bits = 4, bias = 0; static constexpr bool f16 = false, min = true, halves = false, super = true; };

constexpr int value_bytes_for(int bits) { return bits == 8 ? 256 : bits == 6 ? 192 : 128; }
constexpr int scale_bytes_for(bool f16) { return f16 ? 16 : 32; }
// A block's bytes: values, then (super) its integer scales, else its float scales and offsets.
constexpr int block_bytes_for(int bits, bool f16, bool min, bool halves, bool super) {
  return super ? value_bytes_for(bits) + (min ? 16 : 0) + (halves ? 16 : 0)
               : value_bytes_for(bits) + scale_bytes_for(f16) * (min ? 2 : 1) + (halves ? 16 : 0);
}
// The fp16 scales after a super-block's 8 blocks: d (and -dmin).
constexpr int tail_bytes_for(bool min, bool super) { return super ? (min ? 32 : 16) : 0; }
constexpr int64_t super_bytes_for(int bits, bool f16, bool min, bool halves, bool super) {
  return 8 * block_bytes_for(bits, f16, min, halves, super) + tail_bytes_for(min, super);
}
// Offsets of block b, and of its super-block's scales, from the start of its group.
constexpr int64_t block_offset_for(int bits, bool f16, bool min, bool halves, bool super, int64_t b) {
  return super ? (b >> 3) * super_bytes_for(bits, f16, min, halves, super) + (b & 7) * block_bytes_for(bits, f16, min, halves, super)
               : b * block_bytes_for(bits, f16, min, halves, super);
}
constexpr int64_t tail_offset_for(int bits, bool f16, bool min, bool halves, bool super, int64_t b) {
  return (b >> 3) * super_bytes_for(bits, f16, min, halves, super) + 8 * block_bytes_for(bits, f16, min, halves, super);
}
// A group's bytes: nb blocks (a multiple of 8 for super-block formats).
constexpr int64_t group_bytes_for(int bits, bool f16, bool min, bool halves, bool super, int64_t nb) {
  return super ? nb / 8 * super_bytes_for(bits, f16, min, halves, super) : nb * block_bytes_for(bits, f16, min, halves, super);
}
#define SS_PQ(P) P::bits, P::f16, P::min, P::halves, P::super
template <class P> constexpr int value_bytes() { return value_bytes_for(P::bits); }
template <class P> constexpr int scale_bytes() { return scale_bytes_for(P::f16); }
template <class P> constexpr int block_bytes() { return block_bytes_for(SS_PQ(P)); }
template <class P> constexpr int64_t group_bytes(int64_t nb) { return group_bytes_for(SS_PQ(P), nb); }

// The weight scales dw (and offsets mw) of block b's 8 rows: blk the block, grp its group's start.
template <class P>
inline void block_scales(const uint8_t* grp, int64_t b, const uint8_t* blk, __m256* dw, __m256* mw) {
  constexpr int VB = value_bytes<P>();
  if constexpr (P::super) {
    const uint8_t* t = grp + tail_offset_for(SS_PQ(P), b);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
    if constexpr (P::min) {
      auto ints = [](const uint8_t* p) {
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
      };
      *dw = _mm256_mul_ps(d, ints(blk + VB));
      *mw = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16))), ints(blk + VB + 8));
    } else {
      *dw = d;
    }
  } else {
    *dw = P::f16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + VB)))
                 : _mm256_loadu_ps(reinterpret_cast<const float*>(blk + VB));
    if constexpr (P::min) {
      constexpr int SB = scale_bytes<P>();
      *mw = P::f16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + VB + SB)))
                   : _mm256_loadu_ps(reinterpret_cast<const float*>(blk + VB + SB));
    }
  }
}
// Where a block's Q6_K half scales start.
template <class P> constexpr int halves_offset() { return P::super ? value_bytes<P>() : value_bytes<P>() + scale_bytes<P>(); }

// f(P{}) for the traits P of GGUF format fmt (the Fmt ids of simd.h, which this header does not
// include: see the top); false when fmt has no int8 kernels.
template <class F>
inline bool with_format(int fmt, F&& f) {
  switch (fmt) {
    case 2: f(PQ8_0{}); return true;
    case 3: f(PQ4_1{}); return true;
    case 4: f(PQ4_0{}); return true;
    case 5: f(PQ5_0{}); return true;
    case 6: f(PQ5_1{}); return true;
    case 7: f(PQ4_K{}); return true;
    case 8: f(PQ5_K{}); return true;
    case 9: f(PQ6_K{}); return true;
    default: return false;
  }
}

// Quantized activations of M rows: q [M, K] int8; per row and 32-block: d (scale), sx (d * sum q),
// hs (the sums of q over the two 16-element halves).
struct Act {
  const int8_t* q;
  const float* d;
  const float* sx;
  const int32_t* hs;   // [M, nb, 2]
  int64_t K, nb;
  // Token m0's bytes of block b, the distance to the next token's, and the index of (block b, token m)
  // in d, sx (and hs / 2): the view every tile reads activations through (q8_wide.h has another).
  const int8_t* block(int64_t b, int64_t m0) const { return q + m0 * K + b * 32; }
  int64_t token_stride() const { return K; }
  int64_t at(int64_t b, int64_t m) const { return m * nb + b; }
  // The bias correction's bias * sum(qx) at index ab: over the first half (h 0), the second (1), all (2).
  template <class P>
  int32_t bias_sum(int64_t ab, int h) const { return P::bias * (h < 2 ? hs[2 * ab + h] : hs[2 * ab] + hs[2 * ab + 1]); }
};

// The 32 value bytes of step s (0..7) of a block: lane r = row r's values 4s .. 4s+3.
template <class P>
inline __m256i step_values(const uint8_t* blk, int s) {
  if constexpr (P::bits == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * s));
  } else {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * (s & 3)));
    const __m256i lo = _mm256_and_si256(s < 4 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
    if constexpr (P::bits == 4) return lo;
    const __m256i hraw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * (s >> 2)));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hraw, 2 * (s & 3)), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  }
}

// Weight bytes as the path multiplies them, prepared once per step for every token: on AVX2 a Q8_0
// step becomes its signed values (u ^ 0x80) for the sign trick; every other case is used as stored.
constexpr bool kSignTrick(int bias) { return SS_Q8_PATH == 0 && bias == 128; }

// Whether 4-bit blocks take the int16 pair-sum route (below) rather than this path's dot4.
#ifndef SS_Q8_PAIR16
#define SS_Q8_PAIR16 1
#endif
constexpr bool kPairSums16 = SS_Q8_PAIR16 && SS_Q8_PATH == 0;   // faster there; vpdpbusd is faster where it exists

// acc (8 int32 lanes) += the sums of 4 products of lane-aligned bytes of w (unsigned, or signed for
// the sign trick) and y (signed, |y| <= 127).
template <class P>
inline __m256i dot4(__m256i acc, __m256i w, __m256i y) {
#if SS_Q8_PATH == 1 || SS_Q8_PATH >= 3
  return _mm256_dpbusd_epi32(acc, w, y);
#elif SS_Q8_PATH == 2
  return _mm256_dpbusd_avx_epi32(acc, w, y);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (kSignTrick(P::bias)) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
  } else {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), ones));
  }
#endif
}

template <class P>
inline __m256i prepare(__m256i u) {
  if constexpr (kSignTrick(P::bias)) return _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));
  return u;
}

// The bias correction: raw - bias * (sum of qx) unless the sign trick already multiplied w itself.
template <class P>
inline __m256i unbias(__m256i raw, int32_t qsum) {
  if constexpr (P::bias == 0 || kSignTrick(P::bias)) return raw;
  return _mm256_sub_epi32(raw, _mm256_set1_epi32(P::bias * qsum));
}

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Whether a tile of MB tokens runs odd and even steps in two chains of integer sums (shorter
// dependencies) or, when so many tokens give independent chains enough and registers are short, one.
// Integer sums are exact, so both give the same sums.
template <int MB>
constexpr bool kTwoChains = MB <= 8;

// The exact integer sums of one block for MB tokens against one group's 8 rows: I[i] (lane r: row r)
// is sum_k w[r, k] qx_i[k] (Q6_K: half[i] the first 16 elements', I[i] the second's), before the
// bias correction (see kTwoChains).
template <class P, int MB>
inline void block_sums(const uint8_t* blk, const Act& a, int64_t m0, int64_t b, __m256i* I, __m256i* half) {
  const int8_t* x = a.q + m0 * a.K + b * 32;                   // token i's block: x + i * a.K
  if constexpr (P::bits == 4 && kPairSums16) {
    // 4-bit values: vpmaddubsw pair sums (<= 2 * 15 * 127) added in int16 over the block's 8 steps
    // (<= 30480, no saturation), widened once: the same exact sums with one multiply per step.
    __m256i p16[MB];
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) p16[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      const __m256i wv = step_values<P>(blk, s);
#pragma GCC unroll 16
      for (int i = 0; i < MB; ++i)
        p16[i] = _mm256_add_epi16(p16[i], _mm256_maddubs_epi16(wv, _mm256_set1_epi32(load4(x + i * a.K + 4 * s))));
    }
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) I[i] = _mm256_madd_epi16(p16[i], _mm256_set1_epi16(1));
  } else {
    __m256i odd[MB];
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) I[i] = odd[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      const __m256i wv = prepare<P>(step_values<P>(blk, s));
#pragma GCC unroll 16
      for (int i = 0; i < MB; ++i) {
        const __m256i yb = _mm256_set1_epi32(load4(x + i * a.K + 4 * s));
        if (kTwoChains<MB> && (s & 1)) odd[i] = dot4<P>(odd[i], wv, yb);
        else I[i] = dot4<P>(I[i], wv, yb);
      }
      if (P::halves && s == 3) {      // Q6_K: the first half's sums, kept apart for their own scale
#pragma GCC unroll 16
        for (int i = 0; i < MB; ++i) {
          half[i] = _mm256_add_epi32(I[i], odd[i]);
          I[i] = odd[i] = _mm256_setzero_si256();
        }
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) I[i] = _mm256_add_epi32(I[i], odd[i]);
  }
}

// The last, padded group's n outputs t[0 .. n) into dst: + bias (where given), + dst (accumulating).
inline void store_tail(const float* t, int64_t n, const float* bias, bool accumulate, float* dst) {
  for (int64_t r = 0; r < n; ++r) {
    float v = t[r];
    if (bias) v += bias[r];
    dst[r] = accumulate ? dst[r] + v : v;
  }
}

// MB tokens (rows m0.. of the activations) x the 8 output rows of group g.  y rows have stride ldy;
// rows past N (the padded group's) are not written.
template <class P, int MB>
inline void tile(const uint8_t* w, int64_t gstride, int64_t g, const Act& a, int64_t m0, float* y, int64_t N,
                 int64_t ldy, const float* bias, bool accumulate) {
  __m256 acc[MB];
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i) acc[i] = _mm256_setzero_ps();
  const uint8_t* grp = w + g * gstride;
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = grp + block_offset_for(SS_PQ(P), b);
    for (int l = 0; l < block_bytes<P>(); l += 64)
      _mm_prefetch(reinterpret_cast<const char*>(blk + SS_Q8_PREFETCH + l), _MM_HINT_T0);
    __m256i ia[MB], half[MB];
    block_sums<P, MB>(blk, a, m0, b, ia, half);
    __m256 dw, mw = _mm256_setzero_ps();
    block_scales<P>(grp, b, blk, &dw, &mw);
    __m256i sc0 = _mm256_setzero_si256(), sc1 = _mm256_setzero_si256();
    if constexpr (P::halves) {
      sc0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + halves_offset<P>())));
      sc1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + halves_offset<P>() + 8)));
    }
#pragma GCC unroll 16
    for (int i = 0; i < MB; ++i) {
      const int64_t ab = (m0 + i) * a.nb + b;
      __m256i I;
      if constexpr (P::halves) {
        const __m256i lo = unbias<P>(half[i], a.hs[2 * ab]), hi = unbias<P>(ia[i], a.hs[2 * ab + 1]);
        I = _mm256_add_epi32(_mm256_mullo_epi32(lo, sc0), _mm256_mullo_epi32(hi, sc1));
      } else {
        I = unbias<P>(ia[i], a.hs[2 * ab] + a.hs[2 * ab + 1]);
      }
      const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(a.d[ab]));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), s, acc[i]);
      if constexpr (P::min) acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.sx[ab]), acc[i]);
    }
  }
  const int64_t n0 = g * 8;
#pragma GCC unroll 16
  for (int i = 0; i < MB; ++i) {
    float* dst = y + (m0 + i) * ldy + n0;
    if (n0 + 8 <= N) {
      __m256 v = acc[i];
      if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0));
      if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(dst), v);
      _mm256_storeu_ps(dst, v);
    } else {
      float t[8];
      _mm256_storeu_ps(t, acc[i]);
      store_tail(t, N - n0, bias ? bias + n0 : nullptr, accumulate, dst);
    }
  }
}

// Tokens per run of a tile: AVX2 has 16 vector registers, the AVX-512 paths 32 (any number gives the
// same bits; 16 were slower than 12 on the 16-row tile, whose accumulators then fill every register);
// the AVX512-VNNI paths' tiles of up to 12 tokens run one chain of sums (kTwoChains), so a
// 9-token verification pass reads and unpacks each block once, not in runs of 5 + 4.  One row group per tile: two (in 256- or 512-bit registers) were slower here, most at
// 1-4 tokens, where one weight stream per thread reads fastest.
#ifndef SS_Q8_MB
#define SS_Q8_MB (SS_Q8_PATH == 1 || SS_Q8_PATH >= 3 ? 12 : 4)
#endif
constexpr int MB_MAX = SS_Q8_MB;

// Runs of at most MB_MAX tokens of near-equal size covering M tokens (9 tokens: 5 + 4, not 8 + 1), so
// no run is left to read the weights for one token: f(std::integral_constant<int, size>, first token).
template <class F>
inline void token_runs(int64_t M, F&& f) {
  const int64_t runs = (M + MB_MAX - 1) / MB_MAX;
  int64_t m = 0;
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t size = (M - m) / (runs - r);
    switch (size) {
      case 1: f(std::integral_constant<int, 1>{}, m); break;
      case 2: if constexpr (MB_MAX >= 2) f(std::integral_constant<int, 2>{}, m); break;
      case 3: if constexpr (MB_MAX >= 3) f(std::integral_constant<int, 3>{}, m); break;
      case 4: if constexpr (MB_MAX >= 4) f(std::integral_constant<int, 4>{}, m); break;
      case 5: if constexpr (MB_MAX >= 5) f(std::integral_constant<int, 5>{}, m); break;
      case 6: if constexpr (MB_MAX >= 6) f(std::integral_constant<int, 6>{}, m); break;
      case 7: if constexpr (MB_MAX >= 7) f(std::integral_constant<int, 7>{}, m); break;
      case 8: if constexpr (MB_MAX >= 8) f(std::integral_constant<int, 8>{}, m); break;
      case 9: if constexpr (MB_MAX >= 9) f(std::integral_constant<int, 9>{}, m); break;
      case 10: if constexpr (MB_MAX >= 10) f(std::integral_constant<int, 10>{}, m); break;
      case 11: if constexpr (MB_MAX >= 11) f(std::integral_constant<int, 11>{}, m); break;
      case 12: if constexpr (MB_MAX >= 12) f(std::integral_constant<int, 12>{}, m); break;
      default: break;
    }
    m += size;
  }
}

// All M tokens against group g, in token_runs.
template <class P>
inline void tokens_tile(const uint8_t* w, int64_t gstride, int64_t g, const Act& a, int64_t M, float* y, int64_t N,
                        int64_t ldy, const float* bias, bool acc) {
  token_runs(M, [&](auto mb, int64_t m) { tile<P, decltype(mb)::value>(w, gstride, g, a, m, y, N, ldy, bias, acc); });
}

// Every token against every group: the groups split over the threads, each running all tokens (so a
// group's weights are read from memory once per pass and from cache for the later tokens).  y [M, ldy]:
// its first N columns are written.
template <class P>
void packed_linear(const Act& a, int64_t M, const uint8_t* w, int64_t N, int64_t ldy, const float* bias, float* y,
                   bool acc, int threads) {
  const int64_t groups = (N + 7) / 8, gstride = group_bytes<P>(a.nb);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t g = 0; g < groups; ++g) tokens_tile<P>(w, gstride, g, a, M, y, N, ldy, bias, acc);
}

}  // namespace
