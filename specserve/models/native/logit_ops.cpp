// Logits rows after a pass: the first maximum of each row, greedy verification of chains and trees
// over those maxima (reading only the rows the walk reaches), and grammar masks.
//
// Both read a row once or twice at memory speed, several times faster than torch's CPU argmax and
// xgrammar's mask kernel (BENCHMARKS.md, section 18); a pass with a tree of drafts has one row per node.

#include <cmath>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace {

// The index of the first maximum of x [n] (torch.argmax's choice), or of the first NaN if there is
// one (torch ranks NaN above every number).
int64_t argmax_row(const float* x, int64_t n) {
  // Two passes, faster than one that carries indices: the maximum (4 independent sets of 8 lanes,
  // so that no max waits on the previous round's), then the first index that holds it.
  constexpr int S = 4;
  __m256 best[S], nan = _mm256_setzero_ps();
  for (int s = 0; s < S; ++s) best[s] = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 * S <= n; i += 8 * S) {
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * s);
      best[s] = _mm256_max_ps(best[s], v);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
  }
  bool has_nan = _mm256_movemask_ps(nan) != 0;
  float m = -INFINITY;
  for (int s = 0; s < S; ++s) {
    float lanes[8];
    _mm256_storeu_ps(lanes, best[s]);
    for (int l = 0; l < 8; ++l) m = lanes[l] > m ? lanes[l] : m;
  }
  for (int64_t j = i; j < n; ++j) {
    if (std::isnan(x[j])) has_nan = true;
    else if (x[j] > m) m = x[j];
  }
  if (has_nan) {  // torch ranks NaN above every number: the first NaN
    for (int64_t j = 0; j < n; ++j)
      if (std::isnan(x[j])) return j;
  }
  const __m256 mv = _mm256_set1_ps(m);
  for (i = 0; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < n; ++i)
    if (x[i] == m) return i;
  return 0;  // every entry -inf: the first
}

// Greedy verification of one decoding row's n drafted nodes (verify/tree.py's
// greedy_tree_verify_argmax, and on a chain greedy_verify_argmax, for this one row): node i is
// accepted when its parent is (the pending token always is) and its token is the target's first
// maximum at its parent's logits row; the path ends at the first of the deepest accepted nodes, and
// the emitted token after it is the maximum at that node's row (the pending token's when none is
// accepted).  rows: [n + 1, ld] logits, row 0 the pending token's, row 1 + i node i's; tok, par: [n]
// (par[i] < i, -1: child of the pending token; par null: a chain).  Writes the path (root first) to
// path [n] and returns its length; *final the emitted token.  Each row's maximum is computed once,
// and only for the rows of accepted nodes' parents.
int64_t greedy_row(const float* rows, int64_t ld, int64_t V, int64_t n, const int64_t* tok, const int64_t* par,
                   int64_t* path, int64_t* final) {
  std::vector<int64_t> best(n + 1, -1), depth(n, 0);   // best[r]: row r's maximum (-1: not read yet)
  std::vector<char> ok(n, 0);
  auto at = [&](int64_t r) {
    if (best[r] < 0) best[r] = argmax_row(rows + r * ld, V);
    return best[r];
  };
  int64_t leaf = -1, deepest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = par ? par[i] : i - 1;
    if (p >= 0 && !ok[p]) continue;
    ok[i] = tok[i] == at(p + 1);
    depth[i] = (p >= 0 ? depth[p] : 0) + 1;
    if (ok[i] && depth[i] > deepest) {
      deepest = depth[i];
      leaf = i;
    }
  }
  for (int64_t d = deepest, node = leaf; d > 0; --d) {
    path[d - 1] = node;
    node = par ? par[node] : node - 1;
  }
  *final = at(leaf + 1);
  return deepest;
}

}  // namespace

extern "C" {

// Greedy verification of B decoding rows of one pass (see greedy_row).  x: [*, ld] the pass's
// logits rows of V entries; offset [B]: row b's pending-token row; first [B+1]: row b's nodes are
// first[b] .. first[b+1]-1 of tok / par (par null: every row a chain).  Out: path [first[B]] (row b's
// accepted nodes, indices within the row, at path[first[b] ..]), accepted [B], final [B].
void ss_greedy_verify(const float* x, int64_t ld, int64_t V, int64_t B, const int64_t* offset, const int64_t* first,
                      const int64_t* tok, const int64_t* par, int64_t* path, int64_t* accepted, int64_t* final) {
#pragma omp parallel for schedule(dynamic) if (first[B] + B >= 16)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t f = first[b];
    accepted[b] = greedy_row(x + offset[b] * ld, ld, V, first[b + 1] - f, tok + f, par ? par + f : nullptr,
                             path + f, final + b);
  }
}

// x: [R, ld] fp32 rows of n logits each; out: [R] int64, each row's first maximum (see argmax_row).
void ss_argmax_rows(const float* x, int64_t R, int64_t ld, int64_t n, int64_t* out) {
#pragma omp parallel for schedule(static) if (R >= 8)
  for (int64_t r = 0; r < R; ++r) out[r] = argmax_row(x + r * ld, n);
}

// x: [R, ld] fp32 rows of n logits; bitmask: [R, W] int32, bit j of word w set when token 32w + j is
// allowed.  Every forbidden token's logit becomes -inf, in place (tokens past 32 W stay as they are).
void ss_mask_rows(float* x, int64_t R, int64_t ld, const int32_t* bitmask, int64_t W, int64_t n) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  for (int64_t r = 0; r < R; ++r) {
    float* row = x + r * ld;
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(bitmask + r * W);
    for (int64_t w = 0; w < W && 32 * w < n; ++w) {
      const uint32_t b = bits[w];
      if (b == 0xFFFFFFFFu) continue;
      float* at = row + 32 * w;
      const int64_t m = n - 32 * w < 32 ? n - 32 * w : 32;
      if (b == 0 && m == 32) {
        for (int k = 0; k < 32; k += 8) _mm256_storeu_ps(at + k, ninf);
        continue;
      }
      for (int64_t j = 0; j < m; ++j)
        if (!((b >> j) & 1u)) at[j] = -INFINITY;
    }
  }
}

}  // extern "C"
