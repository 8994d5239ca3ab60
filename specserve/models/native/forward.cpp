// A whole decoding or verification pass in a single call (see simd.h for the kernels' invariance).
//
// Being one foreign call, it takes the Python lock once per pass instead of once per kernel, so other
// Python threads (a server's HTTP and streaming threads) cannot stall the pass between kernels.  The
// pass is described by one versioned structure (SsPass, with a table of SsLayer), mirrored field for
// field by abi.py.  When the pass asks for it, each kernel call is timed into its part (PartTimer in
// decoder.py); the calls are the same either way, so the bits are the same.

#include <array>
#include <chrono>
#include <cstddef>

#include "exports.h"
#include "simd.h"


// The parts a pass is timed by, in the order of decoder.PARTS (checked when the library is loaded).
// NORMS is everything but the linears and attention: embedding, scaling, rmsnorms, residual adds,
// the activation, feature copies and the gather of the wanted rows.
enum Part : int { QKV, O, GATE_UP, DOWN, ATTENTION, LM_HEAD, NORMS, PART_COUNT };
const char* const PART_NAMES[PART_COUNT] = {"qkv", "o", "gate_up", "down", "attention", "lm_head",
                                            "norms+activation"};

// One decoder layer's weights and settings.  A weight is rows of blocks of its format (ss_linear's w);
// a null norm or bias: the layer has none.
struct SsLayer {
  const float* attn_norm;        // [hid]
  const uint8_t* qkv;            // fused QKV [(H + 2 Hkv) D, hid]
  int64_t qkv_fmt;
  const float* qkv_bias;         // [(H + 2 Hkv) D] or null
  const float* q_norm;           // [D] or null (per-head q/k norms)
  const float* k_norm;           // [D] or null
  const uint8_t* o;              // [hid, H D]
  int64_t o_fmt;
  const float* ffn_norm;         // [hid]
  const uint8_t* gate_up;        // fused gate/up [2 inter, hid]
  int64_t gate_up_fmt;
  const uint8_t* down;           // [hid, inter]
  int64_t down_fmt;
  const float* post_attn_norm;   // [hid] or null: norm of the attention output before the residual add (Gemma 3)
  const float* post_ffn_norm;    // [hid] or null: the same for the MLP output
  const float* cos;              // [positions, D] the layer's rotary tables
  const float* sin;              // [positions, D]
  int64_t window;                // sliding window (0: none)
  int64_t act;                   // 0: silu, 1: gelu_tanh
};

// A whole pass: embedding (times embed_scale unless 1), every layer, final norm and LM head.
struct SsPass {
  int64_t version;               // ABI_VERSION
  int64_t pass_size;             // sizeof(SsPass)
  int64_t layer_size;            // sizeof(SsLayer)
  int64_t L, M, hid, inter;      // layers, tokens in the pass, hidden and intermediate sizes
  int64_t H, Hkv, D;             // query heads, key/value heads, head dim
  int64_t R, C;                  // the cache's rows and capacity (slots per row)
  int64_t B;                     // sequences in the pass
  int64_t V;                     // LM-head rows
  int64_t n_logits;              // rows whose logits are wanted (logit_rows); < 0: all M
  float eps, scale, embed_scale; // rmsnorm epsilon, attention scale, embedding multiplier
  const int64_t* tokens;         // [M]
  const int64_t* rows;           // [B] cache rows
  const int64_t* start;          // [B] first slot of each sequence's tokens
  const int64_t* offsets;        // [B+1] sequence b owns tokens offsets[b] .. offsets[b+1]-1
  const int64_t* seq_of;         // [M] each token's sequence
  const int64_t* pos;            // [M] rotary positions
  const int64_t* parent;         // [M] parent within the sequence (-1: a root), or null: chains
  const int64_t* logit_rows;     // [n_logits] gathered in that order, or null
  float* x;                      // [M, hid] the residual stream
  float* hbuf;                   // [M, hid] normed input of each sublayer
  float* qkv;                    // [M, (H + 2 Hkv) D]
  float* q;                      // [M, H D] rotated queries
  float* att;                    // [M, H D] attention output
  float* gu;                     // [M, 2 inter] fused gate/up
  float* act;                    // [M, inter]
  void* kc;                      // [L, R, Hkv, C, D] the cache's keys
  void* vc;                      // [L, R, Hkv, C, D] and values
  int64_t kv;                    // the cache's element type: 0 fp32, 1 bf16
  const uint8_t* embed;          // [vocab, hid] in embed_fmt
  int64_t embed_fmt;
  const float* norm;             // [hid] final norm
  const uint8_t* head;           // [V, hid] in head_fmt
  int64_t head_fmt;
  float* logits;                 // [n_logits or M, V] out
  float* const* feats;           // [L+1]: each layer's input and, at L, the normed output (null: not
                                 // wanted), or null
  const SsLayer* layers;         // [L]
  double* part_seconds;          // [PART_COUNT] seconds added per part, or null: no timing
};

namespace {

// Runs kernel calls, adding each one's seconds into its part when the pass asks for timing (when it
// does not, a call costs one branch more).
class Clock {
 public:
  explicit Clock(double* seconds) : seconds_(seconds) {}

  template <class F>
  void operator()(Part part, F&& call) {
    if (!seconds_) {
      call();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    call();
    seconds_[part] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  double* seconds_;
};

// x += a W^T (a: [M, K], w: [hid, K]), through post_norm first when the layer has one (into hbuf,
// normed, added).
void residual(const SsPass& p, Clock& run, Part part, const float* a, int64_t K, const uint8_t* w, int64_t fmt,
              const float* post_norm) {
  const int f = static_cast<int>(fmt);
  if (!post_norm) {
    run(part, [&] { ss_linear(a, p.M, K, w, f, p.hid, nullptr, p.x, 1); });
    return;
  }
  run(part, [&] { ss_linear(a, p.M, K, w, f, p.hid, nullptr, p.hbuf, 0); });
  run(NORMS, [&] {
    ss_rmsnorm(p.hbuf, post_norm, p.M, p.hid, p.eps, p.hbuf);
    ss_add(p.x, p.hbuf, p.M * p.hid);
  });
}

// Decoder layer i on p.x in place.
void layer(const SsPass& p, const SsLayer& w, int64_t i, Clock& run) {
  const int64_t M = p.M, hid = p.hid, H = p.H, Hkv = p.Hkv, D = p.D;
  const int64_t elem = p.kv ? 2 : 4, per_layer = p.R * Hkv * p.C * D * elem;
  void* kc = static_cast<char*>(p.kc) + i * per_layer;
  void* vc = static_cast<char*>(p.vc) + i * per_layer;
  if (p.feats && p.feats[i]) run(NORMS, [&] { std::memcpy(p.feats[i], p.x, M * hid * sizeof(float)); });
  // 1. attention: norm -> fused QKV -> (q/k norm) RoPE + cache write -> attention -> o (+= residual)
  run(NORMS, [&] { ss_rmsnorm(p.x, w.attn_norm, M, hid, p.eps, p.hbuf); });
  run(QKV, [&] {
    ss_linear(p.hbuf, M, hid, w.qkv, static_cast<int>(w.qkv_fmt), (H + 2 * Hkv) * D, w.qkv_bias, p.qkv, 0);
  });
  run(ATTENTION, [&] {
    ss_rope_cache(p.qkv, w.cos, w.sin, p.rows, p.start, p.offsets, p.seq_of, p.pos, M, H, Hkv, p.C, D, w.q_norm,
                  w.k_norm, p.eps, p.q, kc, vc, p.kv);
    ss_attention(p.q, kc, vc, p.rows, p.start, p.offsets, p.pos, p.parent, p.B, H, Hkv, p.C, D, p.scale, w.window,
                 p.att, p.kv);
  });
  residual(p, run, O, p.att, H * D, w.o, w.o_fmt, w.post_attn_norm);
  // 2. feed-forward: norm -> fused gate/up -> silu (or gelu) * up -> down (+= residual)
  run(NORMS, [&] { ss_rmsnorm(p.x, w.ffn_norm, M, hid, p.eps, p.hbuf); });
  run(GATE_UP, [&] {
    ss_linear(p.hbuf, M, hid, w.gate_up, static_cast<int>(w.gate_up_fmt), 2 * p.inter, nullptr, p.gu, 0);
  });
  run(NORMS, [&] {
    if (w.act) ss_gelu_tanh_mul(p.gu, M, p.inter, p.act);
    else ss_silu_mul(p.gu, M, p.inter, p.act);
  });
  residual(p, run, DOWN, p.act, p.inter, w.down, w.down_fmt, w.post_ffn_norm);
}

// Final norm (and its features), the wanted rows gathered into x (free after the norm), the LM head.
void head(const SsPass& p, Clock& run) {
  const int64_t M = p.M, hid = p.hid;
  run(NORMS, [&] { ss_rmsnorm(p.x, p.norm, M, hid, p.eps, p.hbuf); });
  if (p.feats && p.feats[p.L]) run(NORMS, [&] { std::memcpy(p.feats[p.L], p.hbuf, M * hid * sizeof(float)); });
  const float* out = p.hbuf;
  int64_t n_out = M;
  if (p.n_logits >= 0) {
    run(NORMS, [&] {
      for (int64_t r = 0; r < p.n_logits; ++r)
        std::memcpy(p.x + r * hid, p.hbuf + p.logit_rows[r] * hid, hid * sizeof(float));
    });
    out = p.x;
    n_out = p.n_logits;
  }
  run(LM_HEAD, [&] { ss_linear(out, n_out, hid, p.head, static_cast<int>(p.head_fmt), p.V, nullptr, p.logits, 0); });
}

}  // namespace

extern "C" {

// What Python checks at load: out[4] = {ABI_VERSION, sizeof(SsPass), sizeof(SsLayer), PART_COUNT}.
void ss_forward_abi(int64_t* out) {
  out[0] = ss::ABI_VERSION;
  out[1] = sizeof(SsPass);
  out[2] = sizeof(SsLayer);
  out[3] = PART_COUNT;
}

// Field i of SsPass (which 0) or SsLayer (1): its name, and its offset into *offset; null past the
// last.  abi.py compares every field's offset by name with its mirror's, so a field renamed, moved,
// or two fields swapped on one side fail the load instead of corrupting a pass.
const char* ss_forward_field(int which, int i, int64_t* offset) {
  struct Field { const char* name; int64_t offset; };
#define FIELD(f) Field{#f, static_cast<int64_t>(offsetof(S, f))}
  static const auto pass = [] { using S = SsPass; return std::array{
    FIELD(version), FIELD(pass_size), FIELD(layer_size), FIELD(L), FIELD(M), FIELD(hid), FIELD(inter), FIELD(H),
    FIELD(Hkv), FIELD(D), FIELD(R), FIELD(C), FIELD(B), FIELD(V), FIELD(n_logits), FIELD(eps), FIELD(scale),
    FIELD(embed_scale), FIELD(tokens), FIELD(rows), FIELD(start), FIELD(offsets), FIELD(seq_of), FIELD(pos),
    FIELD(parent), FIELD(logit_rows), FIELD(x), FIELD(hbuf), FIELD(qkv), FIELD(q), FIELD(att), FIELD(gu),
    FIELD(act), FIELD(kc), FIELD(vc), FIELD(kv), FIELD(embed), FIELD(embed_fmt), FIELD(norm), FIELD(head),
    FIELD(head_fmt), FIELD(logits), FIELD(feats), FIELD(layers), FIELD(part_seconds)}; }();
  static const auto layer = [] { using S = SsLayer; return std::array{
    FIELD(attn_norm), FIELD(qkv), FIELD(qkv_fmt), FIELD(qkv_bias), FIELD(q_norm), FIELD(k_norm), FIELD(o),
    FIELD(o_fmt), FIELD(ffn_norm), FIELD(gate_up), FIELD(gate_up_fmt), FIELD(down), FIELD(down_fmt),
    FIELD(post_attn_norm), FIELD(post_ffn_norm), FIELD(cos), FIELD(sin), FIELD(window), FIELD(act)}; }();
#undef FIELD
  const Field* f = which == 0 && i >= 0 && i < static_cast<int>(pass.size()) ? &pass[i]
                   : which == 1 && i >= 0 && i < static_cast<int>(layer.size()) ? &layer[i] : nullptr;
  if (f && offset) *offset = f->offset;
  return f ? f->name : nullptr;
}

// Part i's name (decoder.PARTS[i]), or null past the last.
const char* ss_part_name(int i) { return i >= 0 && i < PART_COUNT ? PART_NAMES[i] : nullptr; }

// One whole pass; returns 0, or (running nothing) 1 when p's version is not ABI_VERSION, 2 when its
// sizes are not this library's.
int ss_forward(const SsPass* p) {
  if (!p || p->version != ss::ABI_VERSION) return 1;
  if (p->pass_size != static_cast<int64_t>(sizeof(SsPass)) || p->layer_size != static_cast<int64_t>(sizeof(SsLayer)))
    return 2;
  Clock run(p->part_seconds);
  run(NORMS, [&] {
    ss_embed(p->tokens, p->M, p->embed, static_cast<int>(p->embed_fmt), p->hid, p->x);
    if (p->embed_scale != 1.0f) ss_scale(p->x, p->embed_scale, p->M * p->hid);
  });
  for (int64_t i = 0; i < p->L; ++i) layer(*p, p->layers[i], i, run);
  head(*p, run);
  return 0;
}

}  // extern "C"
