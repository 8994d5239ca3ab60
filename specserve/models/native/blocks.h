// Weight formats as the kernels read them: per-format block geometry and exact dequantization
// (the values gguf's reference dequantizer produces; see simd.h).  Included by linear.cpp.

#pragma once

#include "simd.h"

namespace ss {

// Per-format block geometry and exact dequantization of block `b` of a row into `out`.
template <int F> struct Blk;
template <> struct Blk<F32> {
  static constexpr int size = 8, vecs = 1, bytes = 32;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    out[0] = _mm256_loadu_ps(reinterpret_cast<const float*>(row) + b * 8);
  }
};
template <> struct Blk<F16> {
  static constexpr int size = 8, vecs = 1, bytes = 16;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    out[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * 16)));
  }
};
// Q8_0: {fp16 d; int8 q[32]}; w = d * q.
template <> struct Blk<Q8_0> {
  static constexpr int size = 32, vecs = 4, bytes = 34;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 34;
    const __m256 d = _mm256_set1_ps(h2f(p));
    for (int c = 0; c < 4; ++c) {
      __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 + 8 * c)));
      out[c] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
    }
  }
};
// Q4_1: {fp16 d; fp16 m; uint8 qs[16]}; element j < 16 is the low nibble of qs[j], element j + 16
// its high nibble; w = d * q + m.  d * q is exact in fp32, so fma(d, q, m) rounds once, exactly as
// gguf's numpy code (d * q) + m does.
template <> struct Blk<Q4_1> {
  static constexpr int size = 32, vecs = 4, bytes = 20;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 20;
    const __m256 d = _mm256_set1_ps(h2f(p)), m = _mm256_set1_ps(h2f(p + 2));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    out[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m);
    out[1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), m);
    out[2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m);
    out[3] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), m);
  }
};

// Q4_0: {fp16 d; uint8 qs[16]}; nibbles as Q4_1; w = d * (q - 8).
template <> struct Blk<Q4_0> {
  static constexpr int size = 32, vecs = 4, bytes = 18;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 18;
    const __m256 d = _mm256_set1_ps(h2f(p));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);
    out[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
    out[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
    out[2] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
    out[3] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
  }
};

// The 5th bits of a Q5_0 / Q5_1 block's elements 8c .. 8c+7 (bit j of the 32-bit qh is element j's),
// shifted to bit 4: [8] int32.
inline __m256i q5_high(uint32_t qh, int c) {
  const __m256i shifts = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i bits = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qh >> (8 * c))), shifts);
  return _mm256_slli_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(1)), 4);
}

// The 4-bit parts of a 32-element block's nibbles (element j < 16: low nibble of qs[j], j >= 16: high
// nibble of qs[j - 16]) for elements 8c .. 8c+7: [8] int32.
inline __m256i nibbles32(const uint8_t* qs, int c) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * (c & 1)));
  const __m128i v = c < 2 ? raw : _mm_srli_epi16(raw, 4);
  return _mm256_cvtepu8_epi32(_mm_and_si128(v, _mm_set1_epi8(0x0F)));
}

// Q5_0: {fp16 d; uint32 qh; uint8 qs[16]}; w = d * ((nibble | high bit << 4) - 16).
template <> struct Blk<Q5_0> {
  static constexpr int size = 32, vecs = 4, bytes = 22;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 22;
    const __m256 d = _mm256_set1_ps(h2f(p));
    uint32_t qh;
    std::memcpy(&qh, p + 2, 4);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_sub_epi32(_mm256_or_si256(nibbles32(p + 6, c), q5_high(qh, c)), _mm256_set1_epi32(16));
      out[c] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
    }
  }
};

// Q5_1: {fp16 d; fp16 m; uint32 qh; uint8 qs[16]}; w = d * (nibble | high bit << 4) + m (d * q exact).
template <> struct Blk<Q5_1> {
  static constexpr int size = 32, vecs = 4, bytes = 24;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 24;
    const __m256 d = _mm256_set1_ps(h2f(p)), m = _mm256_set1_ps(h2f(p + 2));
    uint32_t qh;
    std::memcpy(&qh, p + 4, 4);
    for (int c = 0; c < 4; ++c)
      out[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_or_si256(nibbles32(p + 8, c), q5_high(qh, c))), m);
  }
};

// K-quant scales: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void kscale(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// 8 bytes from p, as int32 lanes after (byte >> shift) & mask.
inline __m256i bytes8(const uint8_t* p, int shift, int mask) {
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu8_epi32(raw), shift), _mm256_set1_epi32(mask));
}

// Q4_K: 256 elements {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qs[128]}, 8 sub-blocks of 32:
// sub-block 2i holds the low nibbles of qs[32i .. 32i+31], 2i+1 the high ones;
// w = (d * sc) * q - dmin * mn.  (d * sc) * q is exact in fp32, so fma(d * sc, q, -dmin * mn) rounds
// once, exactly as gguf's numpy code does.
template <> struct Blk<Q4_K> {
  static constexpr int size = 256, vecs = 32, bytes = 144;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 144;
    const float d = h2f(p), dmin = h2f(p + 2);
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      kscale(p + 4, j, &sc, &mn);
      const __m256 ds = _mm256_set1_ps(d * static_cast<float>(sc)), dm = _mm256_set1_ps(-(dmin * static_cast<float>(mn)));
      const uint8_t* qs = p + 16 + 32 * (j / 2);
      for (int c = 0; c < 4; ++c)
        out[4 * j + c] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(bytes8(qs + 8 * c, 4 * (j & 1), 0x0F)), dm);
    }
  }
};

// Q5_K: {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}: as Q4_K, plus bit j of
// qh[l] as bit 4 of sub-block j's element l.
template <> struct Blk<Q5_K> {
  static constexpr int size = 256, vecs = 32, bytes = 176;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 176;
    const float d = h2f(p), dmin = h2f(p + 2);
    const uint8_t* qh = p + 16;
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      kscale(p + 4, j, &sc, &mn);
      const __m256 ds = _mm256_set1_ps(d * static_cast<float>(sc)), dm = _mm256_set1_ps(-(dmin * static_cast<float>(mn)));
      const uint8_t* qs = p + 48 + 32 * (j / 2);
      for (int c = 0; c < 4; ++c) {
        const __m256i q = _mm256_or_si256(bytes8(qs + 8 * c, 4 * (j & 1), 0x0F),
                                          _mm256_slli_epi32(bytes8(qh + 8 * c, j, 1), 4));
        out[4 * j + c] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(q), dm);
      }
    }
  }
};

// Q6_K: {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d}, two halves of 128 elements, each 4
// groups of 32: group g's element l is (4 bits of ql) | (2 bits of qh[l] at 2g) << 4, minus 32, where
// the 4 bits are the low (g < 2) or high nibble of ql[32 (g & 1) + l]; 16 scales over 16 elements each;
// w = (d * scale) * q, rounded once as in gguf's numpy code.
template <> struct Blk<Q6_K> {
  static constexpr int size = 256, vecs = 32, bytes = 210;
  static inline void load(const uint8_t* row, int64_t b, __m256* out) {
    const uint8_t* p = row + b * 210;
    const float d = h2f(p + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(p + 192);
    for (int h = 0; h < 2; ++h) {
      const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
      for (int g = 0; g < 4; ++g)
        for (int c = 0; c < 4; ++c) {
          const int l = 8 * c;
          const __m256i lo = bytes8(ql + 32 * (g & 1) + l, g < 2 ? 0 : 4, 0x0F);
          const __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(bytes8(qh + l, 2 * g, 3), 4)),
                                             _mm256_set1_epi32(32));
          const float ds = d * static_cast<float>(scales[8 * h + 2 * g + c / 2]);
          out[16 * h + 4 * g + c] = _mm256_mul_ps(_mm256_set1_ps(ds), _mm256_cvtepi32_ps(q));
        }
    }
  }
};

}  // namespace ss
