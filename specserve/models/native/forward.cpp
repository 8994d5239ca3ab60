// A whole decoding or verification pass in a single call (see simd.h for the kernels' invariance).
//
// The same kernel calls, in the same order and with the same arguments, as the step-by-step path
// of NativeTransformer.forward in model.py (used when profiling), so the bits are the same; being
// one foreign call, it takes the Python lock once per pass instead of once per kernel, so other
// Python threads (a server's HTTP and streaming threads) cannot stall the pass between kernels.

#include "simd.h"

extern "C" {
void ss_rmsnorm(const float* x, const float* w, int64_t M, int64_t K, float eps, float* y);
void ss_silu_mul(const float* gu, int64_t M, int64_t I, float* out);
void ss_gelu_tanh_mul(const float* gu, int64_t M, int64_t I, float* out);
void ss_add(float* x, const float* y, int64_t n);
void ss_scale(float* x, float s, int64_t n);
void ss_linear(const float* x, int64_t M, int64_t K, const uint8_t* w, int fmt, int64_t N, const float* bias,
               float* y, int accumulate);
void ss_rope_cache(const float* qkv, const float* cos, const float* sin, const int64_t* rows, const int64_t* start,
                   const int64_t* offsets, const int64_t* seq_of, const int64_t* pos, int64_t N, int64_t H,
                   int64_t Hkv, int64_t C, int64_t D, const float* q_norm, const float* k_norm, float eps,
                   float* q_out, float* kc, float* vc);
void ss_attention(const float* q, const float* kc, const float* vc, const int64_t* rows, const int64_t* start,
                  const int64_t* offsets, const int64_t* pos, const int64_t* parent, int64_t B, int64_t H,
                  int64_t Hkv, int64_t C, int64_t D, float scale, int64_t window, float* out);
void ss_embed(const int64_t* tokens, int64_t n, const uint8_t* w, int fmt, int64_t K, float* out);

// Per-layer weights and settings, LAYER_FIELDS int64 each (pointers as integers, 0 for none):
// POST_ATTN_NORM / POST_FFN_NORM: norms of the attention / MLP output before the residual add (Gemma 3);
// COS, SIN: the layer's rotary tables [positions, D]; WINDOW: its sliding window (0: none); ACT: 0 silu,
// 1 gelu_tanh.
enum LayerField : int {
  ATTN_NORM, QKV_W, QKV_FMT, QKV_BIAS, Q_NORM, K_NORM, O_W, O_FMT, FFN_NORM, GU_W, GU_FMT, DOWN_W, DOWN_FMT,
  POST_ATTN_NORM, POST_FFN_NORM, COS, SIN, WINDOW, ACT, LAYER_FIELDS
};

int ss_layer_fields() { return LAYER_FIELDS; }

// A whole pass: embedding (times embed_scale unless 1), every layer, final norm and LM head.  tokens: [M];
// x: [M, hid] scratch;
// hbuf, qkv, q, att, gu, act: scratch as in model.py; weights: [L, LAYER_FIELDS]; kc, vc: the cache's
// [L, R, Hkv, C, D] tensors; embed / head: the embedding and LM-head matrices (fmt, V rows);
// logit_rows: [n_logits] the rows whose logits are wanted (gathered, in that order); n_logits < 0: all M;
// logits: [n_logits or M, V] out; feats: [L+1] destinations for each layer's input and, at L, the
// normed output (0: not wanted), or null.
void ss_forward(const int64_t* tokens, float* x, float* hbuf, float* qkv, float* q, float* att, float* gu,
                float* act, int64_t L, int64_t M, int64_t hid, int64_t inter, int64_t H, int64_t Hkv, int64_t D,
                int64_t R, int64_t C, float eps, float scale, float embed_scale, const int64_t* rows,
                const int64_t* start, const int64_t* offsets, const int64_t* seq_of, const int64_t* pos,
                const int64_t* parent, int64_t B, const int64_t* weights, float* kc, float* vc,
                const uint8_t* embed, int embed_fmt, const float* norm, const uint8_t* head, int head_fmt, int64_t V,
                const int64_t* logit_rows, int64_t n_logits, float* logits, const int64_t* feats) {
  const int64_t layer_cache = R * Hkv * C * D;
  ss_embed(tokens, M, embed, embed_fmt, hid, x);
  if (embed_scale != 1.0f) ss_scale(x, embed_scale, M * hid);
  for (int64_t i = 0; i < L; ++i) {
    const int64_t* w = weights + i * LAYER_FIELDS;
    auto f32 = [&](int field) { return reinterpret_cast<const float*>(w[field]); };
    auto u8 = [&](int field) { return reinterpret_cast<const uint8_t*>(w[field]); };
    if (feats && feats[i]) std::memcpy(reinterpret_cast<float*>(feats[i]), x, M * hid * sizeof(float));
    float *kci = kc + i * layer_cache, *vci = vc + i * layer_cache;
    // 1. attention: norm -> fused QKV -> (q/k norm) RoPE + cache write -> attention -> o (+= residual,
    //    or into hbuf, post-norm, += residual)
    ss_rmsnorm(x, f32(ATTN_NORM), M, hid, eps, hbuf);
    ss_linear(hbuf, M, hid, u8(QKV_W), static_cast<int>(w[QKV_FMT]), (H + 2 * Hkv) * D, f32(QKV_BIAS), qkv, 0);
    ss_rope_cache(qkv, f32(COS), f32(SIN), rows, start, offsets, seq_of, pos, M, H, Hkv, C, D, f32(Q_NORM),
                  f32(K_NORM), eps, q, kci, vci);
    ss_attention(q, kci, vci, rows, start, offsets, pos, parent, B, H, Hkv, C, D, scale, w[WINDOW], att);
    if (w[POST_ATTN_NORM]) {
      ss_linear(att, M, H * D, u8(O_W), static_cast<int>(w[O_FMT]), hid, nullptr, hbuf, 0);
      ss_rmsnorm(hbuf, f32(POST_ATTN_NORM), M, hid, eps, hbuf);
      ss_add(x, hbuf, M * hid);
    } else {
      ss_linear(att, M, H * D, u8(O_W), static_cast<int>(w[O_FMT]), hid, nullptr, x, 1);
    }
    // 2. feed-forward: norm -> fused gate/up -> silu (or gelu) * up -> down (+= residual, or post-norm
    //    first)
    ss_rmsnorm(x, f32(FFN_NORM), M, hid, eps, hbuf);
    ss_linear(hbuf, M, hid, u8(GU_W), static_cast<int>(w[GU_FMT]), 2 * inter, nullptr, gu, 0);
    if (w[ACT]) ss_gelu_tanh_mul(gu, M, inter, act);
    else ss_silu_mul(gu, M, inter, act);
    if (w[POST_FFN_NORM]) {
      ss_linear(act, M, inter, u8(DOWN_W), static_cast<int>(w[DOWN_FMT]), hid, nullptr, hbuf, 0);
      ss_rmsnorm(hbuf, f32(POST_FFN_NORM), M, hid, eps, hbuf);
      ss_add(x, hbuf, M * hid);
    } else {
      ss_linear(act, M, inter, u8(DOWN_W), static_cast<int>(w[DOWN_FMT]), hid, nullptr, x, 1);
    }
  }
  ss_rmsnorm(x, norm, M, hid, eps, hbuf);
  if (feats && feats[L]) std::memcpy(reinterpret_cast<float*>(feats[L]), hbuf, M * hid * sizeof(float));
  const float* out = hbuf;
  int64_t n_out = M;
  if (n_logits >= 0) {         // gather the wanted rows into x (free after the final norm)
    for (int64_t r = 0; r < n_logits; ++r) std::memcpy(x + r * hid, hbuf + logit_rows[r] * hid, hid * sizeof(float));
    out = x;
    n_out = n_logits;
  }
  ss_linear(out, n_out, hid, head, head_fmt, V, nullptr, logits, 0);
}

}  // extern "C"
