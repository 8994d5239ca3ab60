// Int8 activations (see q8.h): quantizing activation rows, repacking GGUF weight blocks into the
// packed layout, reading packed rows back exactly, and choosing the instruction-set path at run time.
// The AVX2 path is compiled here; the VNNI paths in q8_vnni512.cpp and q8_avxvnni.cpp.

#define SS_Q8_PATH 0
#define SS_Q8_ENTRY ss_q8_linear_avx2
#define SS_Q8_PEAK ss_q8_peak_avx2
#include "q8_entry.h"

#include <cmath>
#include <vector>

#include "blocks.h"
#include "exports.h"


namespace ss {
namespace {

// Paths: 0 AVX2 (always), 1 AVX512-VNNI, 2 AVX-VNNI, 3 AVX512-VNNI on 512-bit registers: each one's
// product and ceiling.
using LinearFn = void (*)(const int8_t*, const float*, const float*, const int32_t*, int64_t, int64_t,
                          const uint8_t*, int, int64_t, int64_t, const float*, float*, int, int);
using PeakFn = double (*)(int64_t, int, int32_t*);
struct Path { LinearFn linear; PeakFn peak; };
const Path kPaths[5] = {{ss_q8_linear_avx2, ss_q8_peak_avx2}, {ss_q8_linear_vnni512, ss_q8_peak_vnni512},
                        {ss_q8_linear_avxvnni, ss_q8_peak_avxvnni}, {ss_q8_linear_vnni512w, ss_q8_peak_vnni512w},
                        {ss_q8_linear_vnni512t, ss_q8_peak_vnni512t}};

bool path_runs(int p) {
  __builtin_cpu_init();
  switch (p) {
    case 0: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case 1: return ss_q8_compiled_vnni512() && __builtin_cpu_supports("avx512vnni") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    case 2: return ss_q8_compiled_avxvnni() && __builtin_cpu_supports("avxvnni");
    case 3: return ss_q8_compiled_vnni512w() && path_runs(1) && __builtin_cpu_supports("avx512f");
    case 4: return ss_q8_compiled_vnni512t() && path_runs(1) && __builtin_cpu_supports("avx512f");
    default: return false;
  }
}

// AVX512-VNNI tiled by the pass (path 4: passes of one or two tokens on the 8-row tile, longer ones on
// the 16-row tile, which is faster there even on CPUs that split a 512-bit operation in two halves,
// since each activation broadcast and weight step serves twice the rows); then AVX-VNNI, AVX2.
// Paths 1 and 3 stay selectable (set_path) to compare against.
int best_path() {
  static const int best = path_runs(4) ? 4 : path_runs(1) ? 1 : path_runs(2) ? 2 : 0;
  return best;
}
int g_path = -1;   // -1: not chosen yet (the best the CPU runs)

// A packed format's traits (q8.h's PQ structs) as run-time values, for the code that packs and
// reads back one block at a time.
struct Traits { int bits, bias; bool f16, min, halves, super; };
bool traits(int fmt, Traits* t) {
  return with_format(fmt, [&](auto p) {
    using P = decltype(p);
    *t = {P::bits, P::bias, P::f16, P::min, P::halves, P::super};
  });
}
#define SS_TR(t) t.bits, t.f16, t.min, t.halves, t.super

// One 32-element block (index j) of a GGUF row, as the packed layout stores it: value bytes u
// (w = dw * (u - bias) + mw), the scale and offset (fp16 bits where the format stores fp16, else
// fp32), Q6_K's two half scales, and for the super-block formats the fp16 bits of d (Q4_K: and of
// -dmin) with the block's integer scale sc and min mn (Q4_K).
struct Unpacked {
  uint8_t u[32];
  float dw, mw;
  uint16_t dw16, mw16;
  int8_t sc[2];
  uint8_t isc, imn;
};

void unpack_block(int fmt, const uint8_t* row, int64_t j, Unpacked* o) {
  auto f16bits = [](const uint8_t* p) { uint16_t h; std::memcpy(&h, p, 2); return h; };
  auto nib = [](const uint8_t* qs, int l) { return l < 16 ? qs[l] & 15 : qs[l - 16] >> 4; };
  switch (fmt) {
    case Q8_0: {
      const uint8_t* p = row + j * Blk<Q8_0>::bytes;
      o->dw16 = f16bits(p);
      for (int l = 0; l < 32; ++l) o->u[l] = static_cast<uint8_t>(p[2 + l] ^ 0x80);
      break;
    }
    case Q4_0: case Q4_1: {
      const int bytes = fmt == Q4_0 ? Blk<Q4_0>::bytes : Blk<Q4_1>::bytes, qoff = fmt == Q4_0 ? 2 : 4;
      const uint8_t* p = row + j * bytes;
      o->dw16 = f16bits(p);
      if (fmt == Q4_1) o->mw16 = f16bits(p + 2);
      for (int l = 0; l < 32; ++l) o->u[l] = static_cast<uint8_t>(nib(p + qoff, l));
      break;
    }
    case Q5_0: case Q5_1: {
      const int bytes = fmt == Q5_0 ? Blk<Q5_0>::bytes : Blk<Q5_1>::bytes, hoff = fmt == Q5_0 ? 2 : 4;
      const uint8_t* p = row + j * bytes;
      o->dw16 = f16bits(p);
      if (fmt == Q5_1) o->mw16 = f16bits(p + 2);
      uint32_t qh;
      std::memcpy(&qh, p + hoff, 4);
      for (int l = 0; l < 32; ++l) o->u[l] = static_cast<uint8_t>(nib(p + hoff + 4, l) | ((qh >> l) & 1) << 4);
      break;
    }
    case Q4_K: case Q5_K: {
      const bool five = fmt == Q5_K;
      const uint8_t* p = row + (j / 8) * (five ? Blk<Q5_K>::bytes : Blk<Q4_K>::bytes);
      const int s = static_cast<int>(j % 8);
      int sc, mn;
      kscale(p + 4, s, &sc, &mn);
      o->dw = h2f(p) * static_cast<float>(sc);
      o->mw = -(h2f(p + 2) * static_cast<float>(mn));
      o->dw16 = f16bits(p);
      o->mw16 = static_cast<uint16_t>(f16bits(p + 2) ^ 0x8000);     // -dmin: (-dmin) * mn = -(dmin * mn)
      o->isc = static_cast<uint8_t>(sc);
      o->imn = static_cast<uint8_t>(mn);
      const uint8_t* qs = p + (five ? 48 : 16) + 32 * (s / 2);
      for (int l = 0; l < 32; ++l) {
        int q = (qs[l] >> (4 * (s & 1))) & 15;
        if (five) q |= ((p[16 + l] >> s) & 1) << 4;
        o->u[l] = static_cast<uint8_t>(q);
      }
      break;
    }
    case Q6_K: {
      const uint8_t* p = row + (j / 8) * Blk<Q6_K>::bytes;
      const int s = static_cast<int>(j % 8), h = s / 4, g = s % 4;
      const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
      const int8_t* scales = reinterpret_cast<const int8_t*>(p + 192);
      o->dw = h2f(p + 208);
      o->dw16 = f16bits(p + 208);
      o->sc[0] = scales[8 * h + 2 * g];
      o->sc[1] = scales[8 * h + 2 * g + 1];
      for (int l = 0; l < 32; ++l) {
        const int lo = (ql[32 * (g & 1) + l] >> (g < 2 ? 0 : 4)) & 15, hi = (qh[l] >> (2 * g)) & 3;
        o->u[l] = static_cast<uint8_t>(lo | hi << 4);
      }
      break;
    }
    default: break;
  }
}

// The exact value of element l of row r of block j of a packed group (grp: its first byte), as gguf's
// reference dequantizer computes it.
float value(const Traits& t, const uint8_t* grp, int64_t j, int r, int l) {
  const int vb = value_bytes_for(t.bits), sb = scale_bytes_for(t.f16);
  const uint8_t* blk = grp + block_offset_for(SS_TR(t), j);
  const uint8_t* tail = grp + tail_offset_for(SS_TR(t), j);
  int u;
  if (t.bits == 8) {
    u = blk[32 * (l / 4) + 4 * r + l % 4];
  } else {
    const int s = l / 4, byte = blk[32 * (s & 3) + 4 * r + l % 4];
    u = s < 4 ? byte & 15 : byte >> 4;
    if (t.bits == 6) u |= ((blk[128 + 32 * (s >> 2) + 4 * r + l % 4] >> (2 * (s & 3))) & 3) << 4;
  }
  float dw, mw = 0.0f;
  if (t.super) {
    dw = h2f(tail + 2 * r);
    if (t.min) {
      mw = h2f(tail + 16 + 2 * r) * static_cast<float>(blk[vb + 8 + r]);
      dw *= static_cast<float>(blk[vb + r]);
    }
  } else {
    dw = t.f16 ? h2f(blk + vb + 2 * r) : reinterpret_cast<const float*>(blk + vb)[r];
    if (t.min) mw = t.f16 ? h2f(blk + vb + sb + 2 * r) : reinterpret_cast<const float*>(blk + vb + sb)[r];
  }
  if (t.min) return std::fma(dw, static_cast<float>(u), mw);
  if (t.halves) {
    const int8_t sc = reinterpret_cast<const int8_t*>(blk + (t.super ? vb : vb + sb))[8 * (l / 16) + r];
    return (dw * static_cast<float>(sc)) * static_cast<float>(u - t.bias);
  }
  return dw * static_cast<float>(u - t.bias);
}

// Row r's unpacked block o into packed block blk (and its super-block's scales at tail) of format P.
template <class P>
inline void place(const Unpacked& o, int r, int64_t j, uint8_t* blk, uint8_t* tail) {
  constexpr int vb = value_bytes_for(P::bits), sb = scale_bytes_for(P::f16);
  if constexpr (P::bits == 8) {
    for (int s = 0; s < 8; ++s) std::memcpy(blk + 32 * s + 4 * r, o.u + 4 * s, 4);
  } else {
    for (int t = 0; t < 4; ++t) {
      uint8_t v[4];
      for (int i = 0; i < 4; ++i)
        v[i] = static_cast<uint8_t>((o.u[4 * t + i] & 15) | (o.u[16 + 4 * t + i] & 15) << 4);
      std::memcpy(blk + 32 * t + 4 * r, v, 4);
    }
    if constexpr (P::bits == 6)
      for (int t = 0; t < 2; ++t) {
        uint8_t v[4];
        for (int i = 0; i < 4; ++i) {
          int h = 0;
          for (int k = 0; k < 4; ++k) h |= (o.u[4 * (4 * t + k) + i] >> 4) << (2 * k);
          v[i] = static_cast<uint8_t>(h);
        }
        std::memcpy(blk + 128 + 32 * t + 4 * r, v, 4);
      }
  }
  if constexpr (P::super) {
    if (j % 8 == 0) {
      std::memcpy(tail + 2 * r, &o.dw16, 2);
      if constexpr (P::min) std::memcpy(tail + 16 + 2 * r, &o.mw16, 2);
    }
    if constexpr (P::min) {
      blk[vb + r] = o.isc;
      blk[vb + 8 + r] = o.imn;
    }
  } else if constexpr (P::f16) {
    std::memcpy(blk + vb + 2 * r, &o.dw16, 2);
    if constexpr (P::min) std::memcpy(blk + vb + sb + 2 * r, &o.mw16, 2);
  } else {
    std::memcpy(blk + vb + 4 * r, &o.dw, 4);
    if constexpr (P::min) std::memcpy(blk + vb + sb + 4 * r, &o.mw, 4);
  }
  if constexpr (P::halves) {
    constexpr int at = P::super ? vb : vb + sb;
    blk[at + r] = static_cast<uint8_t>(o.sc[0]);
    blk[at + 8 + r] = static_cast<uint8_t>(o.sc[1]);
  }
}

// w: [N, row_bytes(fmt, K)] GGUF blocks of format fmt (traits P) -> out in the packed layout (q8.h).
template <class P>
void pack(const uint8_t* w, int fmt, int64_t N, int64_t K, uint8_t* out) {
  const int64_t rb = ss_row_bytes(fmt, K), nb = K / 32, groups = (N + 7) / 8, gb = group_bytes<P>(nb);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* grp = out + g * gb;
    std::memset(grp, 0, gb);
    for (int r = 0; r < 8; ++r) {
      const int64_t n = 8 * g + r;
      for (int64_t j = 0; j < nb; ++j) {
        Unpacked o{};
        if (n < N) unpack_block(fmt, w + n * rb, j, &o);
        else if (P::bias) std::memset(o.u, P::bias, 32);          // padding rows: weights of 0
        place<P>(o, r, j, grp + block_offset_for(SS_PQ(P), j), grp + tail_offset_for(SS_PQ(P), j));
      }
    }
  }
}

// Row m of x [M, K] as int8 blocks of 32: q = round(x * 127 / amax), d = amax / 127.
void quantize_row(const float* x, int64_t K, int8_t* q, float* d, float* sx, int32_t* hs) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + 32 * b;
    __m256 v[4], m = _mm256_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      v[c] = _mm256_loadu_ps(xb + 8 * c);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[c]));
    }
    const float amax = hmax(m);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    __m256i qi[4];
    for (int c = 0; c < 4; ++c) qi[c] = _mm256_cvtps_epi32(_mm256_mul_ps(v[c], _mm256_set1_ps(id)));
    // int32 -> int8 keeping element order (packs interleave the 128-bit lanes; the permute undoes it)
    const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), p8);
    int32_t s0 = 0, s1 = 0;
    for (int l = 0; l < 16; ++l) s0 += q[32 * b + l];
    for (int l = 16; l < 32; ++l) s1 += q[32 * b + l];
    d[b] = amax / 127.0f;
    hs[2 * b] = s0;
    hs[2 * b + 1] = s1;
    sx[b] = d[b] * static_cast<float>(s0 + s1);
  }
}

}  // namespace
}  // namespace ss

using namespace ss;

extern "C" {

// Whether path p (0 AVX2, 1 AVX512-VNNI, 2 AVX-VNNI, 3 AVX512-VNNI on 512-bit registers) runs on this CPU.
int ss_q8_path_runs(int p) { return path_runs(p) ? 1 : 0; }

// Use path p for later int8 products (-1: the best this CPU runs, see best_path); returns the path now in use, or
// -1 (and changes nothing) when this CPU cannot run p.
int ss_q8_set_path(int p) {
  if (p < 0) p = best_path();
  if (!path_runs(p)) return -1;
  g_path = p;
  return p;
}

int ss_q8_path() { return g_path < 0 ? best_path() : g_path; }

// The int8 multiply-add ceiling of the path in use (see SS_Q8_PEAK): seconds for `iters` rounds.
double ss_int8_peak(int64_t iters, int32_t* sink) { return kPaths[ss_q8_path()].peak(iters, threads(), sink); }

// Bytes of the packed form of an [N, K] weight of GGUF format fmt (-1: not packable).
int64_t ss_packed_bytes(int fmt, int64_t N, int64_t K) {
  Traits t;
  if (!traits(fmt, &t) || K % (t.super ? 256 : 32)) return -1;
  return (N + 7) / 8 * group_bytes_for(SS_TR(t), K / 32);
}

// w: [N, row_bytes(fmt, K)] GGUF blocks -> out: ss_packed_bytes(fmt, N, K) bytes (see q8.h).
void ss_pack(const uint8_t* w, int fmt, int64_t N, int64_t K, uint8_t* out) {
  with_format(fmt, [&](auto p) { pack<decltype(p)>(w, fmt, N, K, out); });
}

// Gather rows of a packed weight: tokens [n] -> out [n, K] fp32, the exact values of the GGUF blocks.
void ss_packed_rows(const int64_t* tokens, int64_t n, const uint8_t* w, int pfmt, int64_t K, float* out) {
  Traits t;
  const int fmt = pfmt - PACKED;
  if (!traits(fmt, &t)) return;
  const int64_t nb = K / 32, gb = group_bytes_for(SS_TR(t), nb);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* grp = w + tokens[i] / 8 * gb;
    const int r = static_cast<int>(tokens[i] % 8);
    for (int64_t j = 0; j < nb; ++j)
      for (int l = 0; l < 32; ++l) out[i * K + 32 * j + l] = value(t, grp, j, r, l);
  }
}

// Activations as the int8 kernels read them: x [M, K] -> q [M, K], d / sx [M, K/32], hs [M, K/32, 2].
void ss_quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* sx, int32_t* hs) {
  const int64_t nb = K / 32;
#pragma omp parallel for schedule(static) num_threads(threads()) if (M * K >= 8192)
  for (int64_t m = 0; m < M; ++m) quantize_row(x + m * K, K, q + m * K, d + m * nb, sx + m * nb, hs + 2 * m * nb);
}

// y [M, N] (+)= quantize(x [M, K]) W^T (+ bias) for a packed weight w of packed format pfmt, or of
// MIXED parts (see simd.h), each multiplied on its own format's kernel into its columns of y from the
// activations quantized once.
void ss_q8_linear(const float* x, int64_t M, int64_t K, const uint8_t* w, int pfmt, int64_t N, const float* bias,
                  float* y, int accumulate) {
  const int64_t nb = K / 32;
  // The quantized activations: one buffer per calling thread, grown as needed and kept, so a pass's
  // linears allocate nothing.
  thread_local std::vector<uint8_t> kept;
  const size_t need = static_cast<size_t>(M * K + M * nb * 16 + 64);
  if (kept.size() < need) kept.resize(need);
  uint8_t* buf = kept.data();
  int8_t* q = reinterpret_cast<int8_t*>(buf);
  float* d = reinterpret_cast<float*>(buf + ((M * K + 15) / 16) * 16);
  float* sx = d + M * nb;
  int32_t* hs = reinterpret_cast<int32_t*>(sx + M * nb);
  ss_quantize_rows(x, M, K, q, d, sx, hs);
  const LinearFn linear = kPaths[ss_q8_path()].linear;
  if (pfmt == MIXED) {
    const int64_t* h = reinterpret_cast<const int64_t*>(w);
    for (int64_t i = 0, n0 = 0; i < h[0]; n0 += h[2 + 3 * i], ++i)
      linear(q, d, sx, hs, M, K, w + h[3 + 3 * i], static_cast<int>(h[1 + 3 * i]), h[2 + 3 * i], N,
             bias ? bias + n0 : nullptr, y + n0, accumulate, threads());
  } else {
    linear(q, d, sx, hs, M, K, w, pfmt, N, N, bias, y, accumulate, threads());
  }
}

}  // extern "C"
