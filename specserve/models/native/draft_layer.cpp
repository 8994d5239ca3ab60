// A learned drafter's EAGLE layer (one decoder layer over the target's features, in one of the
// layouts draft_layer.py describes: eagle, eagle3, or a deeper head's plain decoder layer) for M entries in a single call: the input, RMSNorms, fused QKV,
// RoPE, the key/value writes, attention over each sequence's own entries under its mask, o, the
// SiLU-gated MLP.  The products are ss_linear's (the target's kernels); the rest
// runs here in fixed order per row.  Called from Python once per head call, instead of the twenty-odd
// small torch operations the same layer costs op by op (each of which costs more in overhead than
// in arithmetic at a few rows).  The final norm before the reduced LM head is left to the caller
// (ss_rmsnorm), which runs it on the rows it wants logits for.

#include <algorithm>
#include <array>
#include <cstddef>
#include <utility>
#include <vector>

#include "exports.h"
#include "simd.h"


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
  int64_t layout;                // 0: eagle (fc over [emb_norm(e) ; feat_norm(g)]), 1: eagle3,
                                 // 2: decoder (x = g; emb unread)
  int64_t M, hid, H, Hkv, D, inter, B;
  float eps, scale;
  const float* norm_e;           // [hid] eagle: emb_norm; eagle3: input_norm; decoder: null
  const float* norm_g;           // [hid] eagle: feat_norm; eagle3: hidden_norm; decoder: null
  const uint8_t* fc;             // eagle: [hid, 2 hid]; else null
  int64_t fc_fmt;
  const float* attn_norm;        // eagle, decoder: [hid]; eagle3: null
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

// Softmax in place over w[0 .. end) (masked keys at -inf become exact zeros; w padded to end + 8):
// vectorised 8 keys at a time.  Returns 1 / the sum of the exponentials.
float softmax_exp(float* w, int64_t end) {
  for (int64_t j = end; j < end + 8; ++j) w[j] = -INFINITY;         // padding lanes: exact zeros below
  const __m256 none = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
  __m256 mx = none;
  for (int64_t j = 0; j < end; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(w + j));
  const __m256 top = _mm256_set1_ps(hmax(mx));
  __m256 sum = zero;
  for (int64_t j = 0; j < end; j += 8) {
    const __m256 v = _mm256_loadu_ps(w + j);
    const __m256 e = _mm256_blendv_ps(exp8(_mm256_sub_ps(v, top)), zero, _mm256_cmp_ps(v, none, _CMP_EQ_OQ));
    _mm256_storeu_ps(w + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  return 1.0f / hsum(sum);
}

// One row of a part against key/value head g, for R of the query heads that share it (h0 ..
// h0 + R - 1): each key and each value read once for all R (scores by dot products, the values'
// weighted sums 8 dimensions at a time with the R sums in registers).  w: scratch of R * (end + 8).
template <int R>
void attend_group(const SsDraftLayer& p, const SsDraftPart& s, int64_t r, int64_t g, int64_t h0, const float* q,
                  float* out, float* w) {
  const int64_t Hkv = p.Hkv, D = p.D, end = s.at + s.m, row = s.row0 + r, self = s.at + r, stride = end + 8;
  const float* qg = q + (row * p.H + h0) * D;
  for (int64_t j = 0; j < end; ++j) {
    const bool seen = j < s.n_real || (s.mask ? s.mask[r * s.mask_stride + j - s.n_real] != 0 : j <= self);
    const float* kj = s.k + (j * Hkv + g) * D;
    for (int i = 0; i < R; ++i) w[i * stride + j] = seen ? dot(qg + i * D, kj, D) * p.scale : -INFINITY;
  }
  float inv[R];
  for (int i = 0; i < R; ++i) inv[i] = softmax_exp(w + i * stride, end);
  float* o = out + (row * p.H + h0) * D;
  const int64_t step = Hkv * D;                                       // from one key's values to the next
  const float* v0 = s.v + g * D;
  for (int64_t d = 0; d < D; d += 8) {
    __m256 acc[R];
    for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < end; ++j) {
      const __m256 v = _mm256_loadu_ps(v0 + j * step + d);
      for (int i = 0; i < R; ++i) acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(_mm256_set1_ps(w[i * stride + j]), v));
    }
    for (int i = 0; i < R; ++i) _mm256_storeu_ps(o + i * D + d, _mm256_mul_ps(acc[i], _mm256_set1_ps(inv[i])));
  }
}

// A row against one key/value head, whatever its share of query heads: R = 1 .. 4 at once, more in
// groups of up to 4 (each group reads the keys and values once).
void attend_row_group(const SsDraftLayer& p, const SsDraftPart& s, int64_t r, int64_t g, const float* q, float* out,
                      float* w) {
  const int64_t rep = p.H / p.Hkv;
  for (int64_t h0 = g * rep; h0 < (g + 1) * rep; h0 += 4) {
    switch (std::min<int64_t>(4, (g + 1) * rep - h0)) {
      case 1: attend_group<1>(p, s, r, g, h0, q, out, w); break;
      case 2: attend_group<2>(p, s, r, g, h0, q, out, w); break;
      case 3: attend_group<3>(p, s, r, g, h0, q, out, w); break;
      default: attend_group<4>(p, s, r, g, h0, q, out, w); break;
    }
  }
}

// Attention of every part's rows (q [M, H D] rotated, keys and values already written): out [M, H D],
// the (row, key/value head) pairs split over the threads when the keys they read are many enough to
// pay for waking them.
void attend(const SsDraftLayer& p, const float* q, float* out) {
  std::vector<std::pair<const SsDraftPart*, int64_t>> rows;         // (part, row within it)
  int64_t keys = 0, widest = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    const SsDraftPart& s = p.parts[b];
    for (int64_t r = 0; r < s.m; ++r) rows.emplace_back(&s, r);
    keys += s.m * (s.at + s.m);
    widest = std::max(widest, s.at + s.m);
  }
  const int64_t pairs = static_cast<int64_t>(rows.size()) * p.Hkv;
#pragma omp parallel num_threads(threads()) if (keys * p.H * p.D >= (1 << 18))
  {
    std::vector<float> w(4 * (widest + 8));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < pairs; ++i)
      attend_row_group(p, *rows[i / p.Hkv].first, rows[i / p.Hkv].second, i % p.Hkv, q, out, w.data());
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

// Field i of SsDraftLayer (which 0) or SsDraftPart (1): its name, and its offset into *offset; null
// past the last (abi.py compares them by name with its mirror's, as ss_forward_field).
const char* ss_draft_layer_field(int which, int i, int64_t* offset) {
  struct Field { const char* name; int64_t offset; };
#define FIELD(f) Field{#f, static_cast<int64_t>(offsetof(S, f))}
  static const auto layer = [] { using S = SsDraftLayer; return std::array{
    FIELD(version), FIELD(layer_size), FIELD(part_size), FIELD(layout), FIELD(M), FIELD(hid), FIELD(H),
    FIELD(Hkv), FIELD(D), FIELD(inter), FIELD(B), FIELD(eps), FIELD(scale), FIELD(norm_e), FIELD(norm_g),
    FIELD(fc), FIELD(fc_fmt), FIELD(attn_norm), FIELD(qkv), FIELD(qkv_fmt), FIELD(o), FIELD(o_fmt),
    FIELD(mlp_norm), FIELD(gate_up), FIELD(gate_up_fmt), FIELD(down), FIELD(down_fmt), FIELD(g), FIELD(emb),
    FIELD(pos), FIELD(cos), FIELD(sin), FIELD(positions), FIELD(parts), FIELD(out)}; }();
  static const auto part = [] { using S = SsDraftPart; return std::array{
    FIELD(k), FIELD(v), FIELD(capacity), FIELD(row0), FIELD(m), FIELD(at), FIELD(n_real), FIELD(mask),
    FIELD(mask_stride)}; }();
#undef FIELD
  const Field* f = which == 0 && i >= 0 && i < static_cast<int>(layer.size()) ? &layer[i]
                   : which == 1 && i >= 0 && i < static_cast<int>(part.size()) ? &part[i] : nullptr;
  if (f && offset) *offset = f->offset;
  return f ? f->name : nullptr;
}

// One call of the layer; returns 0, or (running nothing) 1 when p's version is not ABI_VERSION, 2 when
// its sizes are not this library's or its layout none of the three, 3 when a position lies outside the rotary tables, 4 when a part's
// rows lie outside the call's, its slots outside its buffers or its mask rows short of its slots.
int ss_draft_layer(const SsDraftLayer* p) {
  if (!p || p->version != ABI_VERSION) return 1;
  if (p->layer_size != static_cast<int64_t>(sizeof(SsDraftLayer)) ||
      p->part_size != static_cast<int64_t>(sizeof(SsDraftPart)) || p->layout < 0 || p->layout > 2)
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
  const int64_t in = p->layout == 1 ? 2 * hid : hid;
  std::vector<float> a(M * 2 * hid), x(M * hid), hn(M * in), qkv(M * W), q(M * H * D), att(M * H * D),
      gu(M * 2 * p->inter), act(M * p->inter);
  // 1. the layer input: eagle x = fc([emb_norm(e) ; feat_norm(g)]), hn = attn_norm(x);
  //    eagle3 hn = [input_norm(e) ; hidden_norm(g)], the residual stream starts at g;
  //    decoder x = g, hn = attn_norm(x)
  for (int64_t m = 0; p->layout != 2 && m < M; ++m) {
    ss_rmsnorm(p->emb + m * hid, p->norm_e, 1, hid, p->eps, a.data() + m * 2 * hid);
    ss_rmsnorm(p->g + m * hid, p->norm_g, 1, hid, p->eps, a.data() + m * 2 * hid + hid);
  }
  if (p->layout == 2) {
    std::memcpy(x.data(), p->g, M * hid * sizeof(float));
    ss_rmsnorm(x.data(), p->attn_norm, M, hid, p->eps, hn.data());
  } else if (p->layout == 0) {
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
  attend(*p, q.data(), att.data());
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
