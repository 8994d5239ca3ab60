// The library's functions that one source calls in another, declared once: every source that calls
// or defines one of them includes this header, so a definition that drifts from its callers' idea
// of it fails to compile instead of misbehaving at run time.  (Python's view of the exported
// functions is abi.py's SIGNATURES.)

#pragma once

#include <cstdint>

extern "C" {
// layer_ops.cpp
void ss_rmsnorm(const float* x, const float* w, int64_t M, int64_t K, float eps, float* y);
void ss_silu_mul(const float* gu, int64_t M, int64_t I, float* out);
void ss_gelu_tanh_mul(const float* gu, int64_t M, int64_t I, float* out);
void ss_add(float* x, const float* y, int64_t n);
void ss_scale(float* x, float s, int64_t n);
void ss_rope_cache(const float* qkv, const float* cos, const float* sin, const int64_t* rows, const int64_t* start,
                   const int64_t* offsets, const int64_t* seq_of, const int64_t* pos, int64_t N, int64_t H,
                   int64_t Hkv, int64_t C, int64_t D, const float* q_norm, const float* k_norm, float eps,
                   float* q_out, void* kc, void* vc, int64_t kv);

// linear.cpp
void ss_linear(const float* x, int64_t M, int64_t K, const uint8_t* w, int fmt, int64_t N, const float* bias,
               float* y, int accumulate);
void ss_embed(const int64_t* tokens, int64_t n, const uint8_t* w, int fmt, int64_t K, float* out);
int64_t ss_row_bytes(int fmt, int64_t K);

// q8.cpp, and each int8 path's entry points (q8_entry.h, compiled once per path)
void ss_q8_linear(const float* x, int64_t M, int64_t K, const uint8_t* w, int pfmt, int64_t N, const float* bias,
                  float* y, int accumulate);
void ss_packed_rows(const int64_t* tokens, int64_t n, const uint8_t* w, int pfmt, int64_t K, float* out);
#define SS_Q8_PATH_ENTRIES(entry, peak)                                                                            \
  void entry(const int8_t* q, const float* d, const float* sx, const int32_t* hs, int64_t M, int64_t K,             \
             const uint8_t* w, int fmt, int64_t N, int64_t ldy, const float* bias, float* y, int accumulate,       \
             int threads);                                                                                          \
  double peak(int64_t iters, int threads, int32_t* sink);
SS_Q8_PATH_ENTRIES(ss_q8_linear_avx2, ss_q8_peak_avx2)
SS_Q8_PATH_ENTRIES(ss_q8_linear_vnni512, ss_q8_peak_vnni512)
SS_Q8_PATH_ENTRIES(ss_q8_linear_avxvnni, ss_q8_peak_avxvnni)
SS_Q8_PATH_ENTRIES(ss_q8_linear_vnni512w, ss_q8_peak_vnni512w)
SS_Q8_PATH_ENTRIES(ss_q8_linear_vnni512t, ss_q8_peak_vnni512t)
#undef SS_Q8_PATH_ENTRIES
int ss_q8_compiled_vnni512();        // whether the optional path was built (0: a stub, never chosen)
int ss_q8_compiled_avxvnni();
int ss_q8_compiled_vnni512w();
int ss_q8_compiled_vnni512t();

// attention.cpp, and its AVX-512 path (attention_avx512.cpp)
void ss_attention(const float* q, const void* kc, const void* vc, const int64_t* rows, const int64_t* start,
                  const int64_t* offsets, const int64_t* pos, const int64_t* parent, int64_t B, int64_t H,
                  int64_t Hkv, int64_t C, int64_t D, float scale, int64_t window, float* out, int64_t kv);
void ss_attention_avx512(const float* q, const void* kc, const void* vc, const int64_t* rows, const int64_t* start,
                         const int64_t* offsets, const int64_t* pos, const int64_t* parent, int64_t B, int64_t H,
                         int64_t Hkv, int64_t C, int64_t D, float scale, int64_t window, float* out, int64_t kv,
                         int threads);
double ss_attention_peak_avx512(int64_t iters);
int ss_attention_compiled_avx512();
}
