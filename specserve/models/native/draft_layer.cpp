// A learned drafter's EAGLE layer (one decoder layer over the target's features, in either of the two
// layouts draft_layer.py describes) for M entries in a single call: the input, RMSNorms, fused QKV,
// RoPE, the key/value writes, attention over each sequence's own entries under its mask, o, the
// SiLU-gated MLP.  The products are ss_linear's (the target's kernels); the rest
// runs here in fixed order per row.  Called from Python once per head call, instead of the twenty-odd
// small torch operations the same layer costs op by op (each of which costs more in overhead than
// in arithmetic at a few rows).  The final norm before the reduced LM head is left to the caller
// (ss_rmsnorm), which runs it on the rows it wants logits for.

#include <vector>

#include "simd.h"

extern "C" {
void ss_rmsnorm(const float* x, const float* w, int64_t M, int64_t K, float eps, float* y);
void ss_silu_mul(const float* gu, int64_t M, int64_t I, float* out);
void ss_linear(const float* x, int64_t M, int64_t K, const uint8_t* w, int fmt, int64_t N, const float* bias,
               float* y, int accumulate);
}

using namespace ss;

// One sequence's rows of the call: rows row0 .. row0+m-1 of the inputs, whose keys and values are
// written at slots at .. at+m-1 of the sequence's own buffers.  Row r sees every slot below n_real
// (its real entries) and, of slots n_real .. at+m-1, those mask marks (mask[r * mask_stride + j] for
// slot n_real + j; null: causal, every slot up to its own).
struct SsDraftPart {
  float* k;                      // [capacity, Hkv, D] the sequence's keys
  float* v;                      // [capacity, Hkv, D] and values
  int64_t capacity;
  int64_t row0, m, at, n_real;
  const uint8_t* mask;           // [m, mask_stride] (bool), or null
  int64_t mask_stride;
};

// The layer: its layout, sizes, weights (products as ss_linear's blocks with their formats, norms
// fp32) and one call's inputs and outputs.  Mirrored field for field by abi.py (SsDraftLayer).
struct SsDraftLayer {
  int64_t version;               // ABI_VERSION
  int64_t layer_size;            // sizeof(SsDraftLayer)
  int64_t part_size;             // sizeof(SsDraftPart)
  int64_t layout;                // 0: eagle (fc over [emb_norm(e) ; feat_norm(g)]), 1: eagle3
  int64_t M, hid, H, Hkv, D, inter, B;
  float eps, scale;
  const float* norm_e;           // [hid] eagle: emb_norm; eagle3: input_norm
  const float* norm_g;           // [hid] eagle: feat_norm; eagle3: hidden_norm
  const uint8_t* fc;             // eagle: [hid, 2 hid]; eagle3: null
  int64_t fc_fmt;
  const float* attn_norm;        // eagle: [hid]; eagle3: null
  const uint8_t* qkv;            // [(H + 2 Hkv) D, in] (in: hid, eagle3 2 hid)
  int64_t qkv_fmt;
  const uint8_t* o;              // [hid, H D]
  int64_t o_fmt;
  const float* mlp_norm;         // [hid] eagle: ffn_norm; eagle3: post_norm
  const uint8_t* gate_up;        // [2 inter, hid] (gate rows first)
  int64_t gate_up_fmt;
  const uint8_t* down;           // [hid, inter]
  int64_t down_fmt;
  const float* g;                // [M, hid] state inputs
  const float* emb;              // [M, hid] token embeddings
  const int64_t* pos;            // [M] rotary positions
  const float* cos;              // [positions, D] cos table, both halves
  const float* sin;              // [positions, D] sin table with its first half negated
  int64_t positions;             // the tables' rows
  const SsDraftPart* parts;      // [B]
  float* out;                    // [M, hid] the layer's outputs
};

namespace {

// out = x * cos + swap_halves(x) * sin (sin's first half negated: rotate-half RoPE, as RopeTable).
inline void rope_row(const float* x, const float* cs, const float* sn, int64_t D, float* out) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < D; ++d) out[d] = x[d] * cs[d] + x[d < half ? d + half : d - half] * sn[d];
}

// Attention of one part's rows (q [M, H D] rotated, keys and values already written): out [M, H D].
void attend(const SsDraftLayer& p, const SsDraftPart& s, const float* q, float* out, std::vector<float>& w) {
  const int64_t H = p.H, Hkv = p.Hkv, D = p.D, rep = H / Hkv, end = s.at + s.m;
  w.resize(end);
  for (int64_t r = 0; r < s.m; ++r) {
    const int64_t row = s.row0 + r, self = s.at + r;
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q + (row * H + h) * D;
      const int64_t g = h / rep;
      float mx = -INFINITY;
      for (int64_t j = 0; j < end; ++j) {
        const bool seen = j < s.n_real || (s.mask ? s.mask[r * s.mask_stride + j - s.n_real] != 0 : j <= self);
        w[j] = seen ? dot(qh, s.k + (j * Hkv + g) * D, D) * p.scale : -INFINITY;
        mx = w[j] > mx ? w[j] : mx;
      }
      float total = 0.0f;
      for (int64_t j = 0; j < end; ++j) {
        w[j] = w[j] == -INFINITY ? 0.0f : std::exp(w[j] - mx);
        total += w[j];
      }
      float* o = out + (row * H + h) * D;
      std::memset(o, 0, D * sizeof(float));
      for (int64_t j = 0; j < end; ++j) {
        if (w[j] == 0.0f) continue;
        const float a = w[j] / total;
        const float* vj = s.v + (j * Hkv + g) * D;
        for (int64_t d = 0; d < D; ++d) o[d] += a * vj[d];
      }
    }
  }
}

}  // namespace

extern "C" {

// What Python checks at load: out[3] = {ABI_VERSION, sizeof(SsDraftLayer), sizeof(SsDraftPart)}.
void ss_draft_layer_abi(int64_t* out) {
  out[0] = ABI_VERSION;
  out[1] = sizeof(SsDraftLayer);
  out[2] = sizeof(SsDraftPart);
}

// One call of the layer; returns 0, or (running nothing) 1 when p's version is not ABI_VERSION, 2 when
// its sizes are not this library's, 3 when a position lies outside the rotary tables, 4 when a part's
// rows lie outside the call's, its slots outside its buffers or its mask rows short of its slots.
int ss_draft_layer(const SsDraftLayer* p) {
  if (!p || p->version != ABI_VERSION) return 1;
  if (p->layer_size != static_cast<int64_t>(sizeof(SsDraftLayer)) ||
      p->part_size != static_cast<int64_t>(sizeof(SsDraftPart)))
    return 2;
  const int64_t M = p->M, hid = p->hid, H = p->H, Hkv = p->Hkv, D = p->D, W = (H + 2 * Hkv) * D;
  for (int64_t m = 0; m < M; ++m)
    if (p->pos[m] < 0 || p->pos[m] >= p->positions) return 3;
  for (int64_t b = 0; b < p->B; ++b) {
    const SsDraftPart& s = p->parts[b];
    if (s.row0 < 0 || s.m < 0 || s.row0 + s.m > M || s.n_real < 0 || s.n_real > s.at || s.at + s.m > s.capacity ||
        (s.mask && s.mask_stride < s.at + s.m - s.n_real))
      return 4;
  }
  const int64_t in = p->layout == 0 ? hid : 2 * hid;
  std::vector<float> a(M * 2 * hid), x(M * hid), hn(M * in), qkv(M * W), q(M * H * D), att(M * H * D),
      gu(M * 2 * p->inter), act(M * p->inter), w;
  // 1. the layer input: eagle x = fc([emb_norm(e) ; feat_norm(g)]), hn = attn_norm(x);
  //    eagle3 hn = [input_norm(e) ; hidden_norm(g)], the residual stream starts at g
  for (int64_t m = 0; m < M; ++m) {
    ss_rmsnorm(p->emb + m * hid, p->norm_e, 1, hid, p->eps, a.data() + m * 2 * hid);
    ss_rmsnorm(p->g + m * hid, p->norm_g, 1, hid, p->eps, a.data() + m * 2 * hid + hid);
  }
  if (p->layout == 0) {
    ss_linear(a.data(), M, 2 * hid, p->fc, static_cast<int>(p->fc_fmt), hid, nullptr, x.data(), 0);
    ss_rmsnorm(x.data(), p->attn_norm, M, hid, p->eps, hn.data());
  } else {
    std::memcpy(x.data(), p->g, M * hid * sizeof(float));
    std::memcpy(hn.data(), a.data(), M * 2 * hid * sizeof(float));
  }
  // 2. q, k, v in one product; RoPE on q and k; k and v written at each part's slots
  ss_linear(hn.data(), M, in, p->qkv, static_cast<int>(p->qkv_fmt), W, nullptr, qkv.data(), 0);
  for (int64_t b = 0; b < p->B; ++b) {
    const SsDraftPart& s = p->parts[b];
    for (int64_t r = 0; r < s.m; ++r) {
      const int64_t row = s.row0 + r, slot = s.at + r;
      const float *src = qkv.data() + row * W, *cs = p->cos + p->pos[row] * D, *sn = p->sin + p->pos[row] * D;
      for (int64_t h = 0; h < H; ++h) rope_row(src + h * D, cs, sn, D, q.data() + (row * H + h) * D);
      for (int64_t h = 0; h < Hkv; ++h) {
        rope_row(src + (H + h) * D, cs, sn, D, s.k + (slot * Hkv + h) * D);
        std::memcpy(s.v + (slot * Hkv + h) * D, src + (H + Hkv + h) * D, D * sizeof(float));
      }
    }
  }
  // 3. attention per part, over its own entries; the residual stream += o(att)
  for (int64_t b = 0; b < p->B; ++b) attend(*p, p->parts[b], q.data(), att.data(), w);
  ss_linear(att.data(), M, H * D, p->o, static_cast<int>(p->o_fmt), hid, nullptr, x.data(), 1);
  // 4. the MLP: x += down(silu(gate) * up)(mlp_norm(x))
  ss_rmsnorm(x.data(), p->mlp_norm, M, hid, p->eps, hn.data());
  ss_linear(hn.data(), M, hid, p->gate_up, static_cast<int>(p->gate_up_fmt), 2 * p->inter, nullptr, gu.data(), 0);
  ss_silu_mul(gu.data(), M, p->inter, act.data());
  ss_linear(act.data(), M, p->inter, p->down, static_cast<int>(p->down_fmt), hid, nullptr, x.data(), 1);
  std::memcpy(p->out, x.data(), M * hid * sizeof(float));
  return 0;
}

}  // extern "C"
